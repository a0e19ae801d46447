package imserver

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/strata-storage/strata/engineapi"
)

// Bounds on what one request may ask for (issue 24), so that no request can
// make the instance manager, which holds every volume of its node, allocate
// or spawn without limit. Each is far above what Strata's managers send.
const (
	// maxEngineReplicas: an engine writes to each replica in parallel and
	// keeps a connection per replica; volumes have one replica per node.
	maxEngineReplicas = 32
	// maxSnapshotNames: names in one SnapshotRemove; a chain cannot hold
	// more snapshots than this (engine/replica's slot limit).
	maxSnapshotNames = 1 << 16
	// Labels are kept in every replica's layer metadata and sent in every
	// Watch event: Kubernetes label sizes, with room for backup labels.
	maxLabels         = 64
	maxLabelKeyLen    = 317 // a 253-byte prefix, '/', a 63-byte name
	maxLabelValueLen  = 1024
	maxJobConcurrency = 64 // backup and restore chunk workers
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), engineapi.ErrInvalid)
}

// checkVolumeSize refuses a size a replica cannot hold: every replica keeps
// a location map over the whole volume (engine/replica), so the largest
// volume is also what bounds that map.
func checkVolumeSize(field string, size int64) error {
	switch {
	case size <= 0 || size%4096 != 0:
		return invalidf("%s %d must be a positive multiple of 4096", field, size)
	case size > engineapi.MaxVolumeSize:
		return invalidf("%s %d exceeds the largest volume, %d (16 TiB)", field, size, int64(engineapi.MaxVolumeSize))
	}
	return nil
}

func checkLabels(field string, labels map[string]string) error {
	if len(labels) > maxLabels {
		return invalidf("%s has %d entries, more than %d", field, len(labels), maxLabels)
	}
	for k, v := range labels {
		switch {
		case k == "":
			return invalidf("%s has an empty key", field)
		case len(k) > maxLabelKeyLen:
			return invalidf("%s key %.40q... is %d bytes, more than %d", field, k, len(k), maxLabelKeyLen)
		case len(v) > maxLabelValueLen:
			return invalidf("%s[%q] is %d bytes, more than %d", field, k, len(v), maxLabelValueLen)
		}
	}
	return nil
}

// checkConcurrency: 0 means the default; negative or huge is a mistake.
func checkConcurrency(field string, n int32) error {
	if n < 0 || n > maxJobConcurrency {
		return invalidf("%s %d must be between 0 (the default) and %d", field, n, maxJobConcurrency)
	}
	return nil
}

func checkCount(field string, n, limit int) error {
	if n > limit {
		return invalidf("%s has %d entries, more than %d", field, n, limit)
	}
	return nil
}

// checkName refuses a name that ends up in a path or a file name (an
// engine's FUSE directory and NBD export are named after its volume, a
// file:// target's objects after volumes and backups) unless it is a
// DNS-1123 subdomain, so "..", "/" and the like never reach a join. The
// managers name instances, volumes and backups after Kubernetes objects,
// whose names are DNS-1123 subdomains, so every legitimate name passes.
func checkName(field, name string) error {
	if name == "" {
		return invalidf("%s is empty", field)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		// %.253q: a hostile name is not echoed back whole.
		return invalidf("%s %.253q: %s", field, name, strings.Join(errs, "; "))
	}
	return nil
}
