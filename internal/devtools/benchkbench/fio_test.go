package benchkbench

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fioJSON is fio's JSON for the suite's jobs, with the figures given.
func fioJSON(failing string) string {
	var jobs []string
	for i, j := range fioJobs {
		errCode := 0
		if j.name == failing {
			errCode = 5
		}
		v := float64(i + 1)
		jobs = append(jobs, fmt.Sprintf(`{"jobname":%q,"error":%d,`+
			`"read":{"iops":%g,"bw":%g,"lat_ns":{"percentile":{"50.000000":%g,"99.000000":%g}}},`+
			`"write":{"iops":%g,"bw":%g,"lat_ns":{"percentile":{"50.000000":%g,"99.000000":%g}}}}`,
			j.name, errCode, v*1000, v*1024, v*1000, v*2000, v*100, v*2048, v*3000, v*4000))
	}
	return `{"fio version":"fio-3.33","jobs":[` + strings.Join(jobs, ",") + `]}`
}

func TestParseFio(t *testing.T) {
	for _, tc := range []struct {
		name, out, wantErr string
		want               figures
	}{
		{name: "every job, after a warning line", out: "fio: note: both iodepth >= 1 and synchronous I/O engine\n" + fioJSON(""),
			want: figures{SeqWriteMiBs: 2, SeqReadMiBs: 2, RandReadIOPS: 3000, RandWriteIOPS: 400,
				ReadP50us: 5, ReadP99us: 10, WriteP50us: 18, WriteP99us: 24}},
		{name: "a job failed", out: fioJSON("randwrite"), wantErr: "fio job randwrite failed with error 5"},
		{name: "a job missing", out: `{"jobs":[{"jobname":"seqwrite"}]}`, wantErr: "no job seqread"},
		{name: "no JSON", out: "fio: pid=0, err=2/file:filesetup.c", wantErr: "no JSON in fio's output"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseFio([]byte(tc.out))
			if tc.wantErr != "" {
				assert.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}
}

// Global options come before the first job; every job waits for the one
// before it (--stonewall), in fioJobs' order.
func TestFioArgs(t *testing.T) {
	args := fioArgs([]string{"--ioengine=libaio", "--filename=/data/f"}, "512M", 10*time.Second)
	first := strings.Join(args, " ")
	assert.True(t, strings.HasPrefix(first, "--output-format=json --size=512M --direct=1 --time_based --runtime=10"), first)
	assert.Less(t, strings.Index(first, "--filename=/data/f"), strings.Index(first, "--name=seqwrite"))
	assert.Equal(t, len(fioJobs), strings.Count(first, "--stonewall"))
	assert.Contains(t, first, "--name=latwrite --rw=randwrite --bs=4k --iodepth=1 --stonewall")
}

func TestWriteTable(t *testing.T) {
	var b strings.Builder
	writeTable(&b, []target{{name: "local", figures: figures{RandReadIOPS: 1000, ReadP50us: 50}},
		{name: "strata", figures: figures{RandReadIOPS: 500, ReadP50us: 100}}})
	lines := strings.Split(b.String(), "\n")
	assert.Equal(t, "| measurement | unit | local | strata |", lines[0])
	assert.Equal(t, "| random read, 4 KiB qd16 | IOPS | 1000 | 500 (0.50×) |", lines[2])
	assert.Contains(t, b.String(), "| read latency p50, 4 KiB qd1 | µs | 50.0 | 100 (2.00×) |")
}
