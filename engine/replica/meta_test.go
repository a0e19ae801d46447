package replica

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzMeta feeds arbitrary bytes to the meta parsers: they must either
// return a valid meta that survives a write/read round trip, or an error;
// never panic.
func FuzzMeta(f *testing.F) {
	for _, s := range []string{
		`{"formatVersion":1,"size":1048576,"head":"volume-head-003.img","headIndex":3,"snapshots":["a","b"]}`,
		`{"formatVersion":1,"size":4096,"head":"volume-head-000.img","headIndex":0,"backingFile":"/x/y","snapshots":[]}`,
		`{"formatVersion":1,"size":4096,"head":"volume-head-000.img","headIndex":0,"snapshots":["a","a"]}`,
		`{"formatVersion":2,"size":4096,"head":"volume-head-000.img","headIndex":0}`,
		`{"formatVersion":1,"size":4095,"head":"volume-head-000.img","headIndex":0}`,
		`{"formatVersion":1,"size":4096,"head":"../../etc/passwd","headIndex":0}`,
		`{"name":"snap-1","parent":"","removed":false,"userCreated":true,"created":"2024-01-02T03:04:05Z","labels":{"a":"b"}}`,
		`{"name":"volume-head","parent":"snap-1","removed":false,"userCreated":false,"created":"2024-01-02T03:04:05.123456789+02:00"}`,
		`{"name":"a","parent":"a","created":"2024-01-02T03:04:05Z"}`,
		`{"name":"a/b","parent":"","created":"2024-01-02T03:04:05Z"}`,
		`{"name":"a","parent":"","created":"yesterday"}`,
		`{"name":"a","parent":"","created":"2024-01-02T03:04:05Z","extra":1}`,
		`{"name":"a","parent":"","created":"2024-01-02T03:04:05Z"} {}`,
		`{"name":"a","parent":"","created":"2024-01-02T03:04:05Z","labels":{"":"x"}}`,
		``, `null`, `{}`, `[]`, `{"formatVersion":1,"size":`, "\xff\xfe",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if v, err := parseVolumeMeta(data); err == nil {
			require.NoError(t, v.validate())
			out, err := json.Marshal(v)
			require.NoError(t, err)
			v2, err := parseVolumeMeta(out)
			require.NoError(t, err, "round trip of %s", out)
			if len(v.Snapshots) == 0 {
				v.Snapshots, v2.Snapshots = nil, nil
			}
			require.Equal(t, v, v2)
		}
		if m, err := parseLayerMeta(data); err == nil {
			require.NoError(t, m.validate())
			out, err := json.Marshal(m)
			require.NoError(t, err)
			m2, err := parseLayerMeta(out)
			require.NoError(t, err, "round trip of %s", out)
			if len(m.Labels) == 0 {
				m.Labels, m2.Labels = nil, nil
			}
			require.Equal(t, m, m2)
		}
	})
}
