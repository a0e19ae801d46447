// Package attachment holds the VolumeAttachment controller: it decides which
// attachment ticket attaches the volume, where, and why the others wait,
// and reaps the tickets of owners that are gone.
package attachment
