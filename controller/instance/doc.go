// Package instance holds the controllers of the data plane's instances: the
// engine and replica controllers, the instance manager controller that feeds
// the instance cache, and the rollout of new instance manager images.
package instance
