// Package setting holds the setting controller: each Setting's status says
// whether its value is valid.
package setting
