// Package quota holds the ResourceQuota controller: each namespace's
// default resource quota's status tells the snapshot space its volumes use.
package quota
