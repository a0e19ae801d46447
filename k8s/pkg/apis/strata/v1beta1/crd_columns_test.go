package v1beta1_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// The columns kubectl get shows for the kinds an admin reads most when
// attaching: what a VolumeAttachment holds and where a replica lives.
func TestPrinterColumns(t *testing.T) {
	tests := []struct {
		crd  string
		want []string // name=jsonPath, in order
	}{
		{"strata.io_volumeattachments.yaml", []string{"Volume=.spec.volume", "Node=.status.currentNodeID",
			"Tickets=.status.tickets", "Satisfied=.status.satisfiedTickets", "Age=.metadata.creationTimestamp"}},
		{"strata.io_replicas.yaml", []string{"Volume=.spec.volumeName", "State=.status.currentState", "Node=.spec.nodeID",
			"Disk=.spec.diskName", "DiskID=.spec.diskID", "Age=.metadata.creationTimestamp"}},
		// What a backup did: the bytes it uploaded; its base in -o wide.
		{"strata.io_backups.yaml", []string{"Snapshot=.status.snapshotName", "State=.status.state",
			"Progress=.status.progress", "BytesDone=.status.bytesDone", "BytesTotal=.status.bytesTotal", "Size=.status.size",
			"Uploaded=.status.uploadedBytes", "IncrementalOn=.status.incrementalOn", "Volume=.status.volumeName",
			"Age=.metadata.creationTimestamp"}},
		{"strata.io_settings.yaml", []string{"Value=.value", "Applied=.status.applied", "Age=.metadata.creationTimestamp"}},
	}
	for _, tc := range tests {
		t.Run(tc.crd, func(t *testing.T) {
			raw, err := os.ReadFile(filepath.Join(crdDir, tc.crd))
			require.NoError(t, err)
			var crd map[string]any
			require.NoError(t, yaml.Unmarshal(raw, &crd))
			for _, v := range dig(crd, "spec", "versions").([]any) {
				var got []string
				for _, c := range v.(map[string]any)["additionalPrinterColumns"].([]any) {
					col := c.(map[string]any)
					got = append(got, col["name"].(string)+"="+col["jsonPath"].(string))
				}
				assert.Equal(t, tc.want, got)
			}
		})
	}
}
