package types

import "strings"

// Data source forms of a volume's spec.dataSource (the CRD's pattern checks
// the characters; ParseDataSource reads the parts).
const (
	SnapshotSourcePrefix = "snap://" // snap://<volume>/<snapshot>
	VolumeSourcePrefix   = "vol://"  // vol://<volume>
)

// DataSource is a parsed spec.dataSource: a volume, or one of its snapshots.
type DataSource struct {
	Volume   string
	Snapshot string // empty for a whole volume
}

// String is the spec.dataSource form of the source.
func (d DataSource) String() string {
	if d.Snapshot != "" {
		return SnapshotSourcePrefix + d.Volume + "/" + d.Snapshot
	}
	return VolumeSourcePrefix + d.Volume
}

// ParseDataSource reads "snap://<volume>/<snapshot>" or "vol://<volume>".
func ParseDataSource(s string) (DataSource, bool) {
	if rest, ok := strings.CutPrefix(s, SnapshotSourcePrefix); ok {
		volume, snapshot, ok := strings.Cut(rest, "/")
		if !ok || volume == "" || snapshot == "" || strings.Contains(snapshot, "/") {
			return DataSource{}, false
		}
		return DataSource{Volume: volume, Snapshot: snapshot}, true
	}
	if volume, ok := strings.CutPrefix(s, VolumeSourcePrefix); ok && volume != "" && !strings.Contains(volume, "/") {
		return DataSource{Volume: volume}, true
	}
	return DataSource{}, false
}
