// Package backup holds the backup target controller (the store's
// availability, its backup volumes, garbage collection and verification),
// the backup controller, the restore of a volume from a backup and the
// recurring jobs.
package backup
