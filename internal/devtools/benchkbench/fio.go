package benchkbench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"
)

// fioJob is one of the suite's measurements, in the order they run: the
// sequential write first, so that every later read finds data (a sparse
// volume would answer unwritten blocks with zeros at no cost).
type fioJob struct {
	name, rw, bs string
	depth        int
}

var fioJobs = []fioJob{
	{"seqwrite", "write", "1M", 16},
	{"seqread", "read", "1M", 16},
	{"randread", "randread", "4k", 16},
	{"randwrite", "randwrite", "4k", 16},
	{"latread", "randread", "4k", 1},
	{"latwrite", "randwrite", "4k", 1},
}

// fioArgs is one fio run of every job in turn (--stonewall) on target,
// given as the engine's options (--filename and --ioengine, or the nbd
// engine's --uri). Direct I/O throughout: the page cache of the Pod's
// node would otherwise answer reads for every target alike.
func fioArgs(target []string, size string, runtime time.Duration) []string {
	// Latency percentiles are of the whole I/O (submission and completion):
	// fio's nbd engine may spend the round trip in submission or in
	// completion, as the scheduler has it, where libaio spends it in
	// completion; the sum is what the application waits.
	args := []string{"--output-format=json", "--size=" + size, "--direct=1", "--time_based",
		fmt.Sprintf("--runtime=%d", int(runtime.Seconds())), "--ramp_time=2", "--group_reporting", "--lat_percentiles=1"}
	args = append(args, target...)
	for _, j := range fioJobs {
		args = append(args, "--name="+j.name, "--rw="+j.rw, "--bs="+j.bs, fmt.Sprintf("--iodepth=%d", j.depth), "--stonewall")
	}
	return args
}

// figures are one target's results.
type figures struct {
	SeqWriteMiBs, SeqReadMiBs   float64
	RandReadIOPS, RandWriteIOPS float64
	ReadP50us, ReadP99us        float64 // qd 1, whole I/O (submission + completion)
	WriteP50us, WriteP99us      float64
}

type fioDirection struct {
	IOPS   float64 `json:"iops"`
	BWKiBs float64 `json:"bw"`
	Lat    struct {
		Percentile map[string]float64 `json:"percentile"`
	} `json:"lat_ns"`
}

type fioOutput struct {
	Jobs []struct {
		Name  string       `json:"jobname"`
		Error int          `json:"error"`
		Read  fioDirection `json:"read"`
		Write fioDirection `json:"write"`
	} `json:"jobs"`
}

// parseFio reads fio's JSON output (warnings fio prints before it are
// skipped) into figures; every job of fioJobs must be there, error-free.
func parseFio(out []byte) (figures, error) {
	var f figures
	start := bytes.IndexByte(out, '{')
	if start < 0 {
		return f, fmt.Errorf("no JSON in fio's output: %q", truncate(out, 400))
	}
	var o fioOutput
	if err := json.Unmarshal(out[start:], &o); err != nil {
		return f, fmt.Errorf("fio's JSON: %w: %q", err, truncate(out[start:], 400))
	}
	byName := map[string]int{}
	for i, j := range o.Jobs {
		if j.Error != 0 {
			return f, fmt.Errorf("fio job %s failed with error %d", j.Name, j.Error)
		}
		byName[j.Name] = i
	}
	for _, want := range fioJobs {
		if _, ok := byName[want.name]; !ok {
			return f, fmt.Errorf("fio's output has no job %s", want.name)
		}
	}
	job := func(name string) (fioDirection, fioDirection) {
		j := o.Jobs[byName[name]]
		return j.Read, j.Write
	}
	_, w := job("seqwrite")
	f.SeqWriteMiBs = w.BWKiBs / 1024
	r, _ := job("seqread")
	f.SeqReadMiBs = r.BWKiBs / 1024
	r, _ = job("randread")
	f.RandReadIOPS = r.IOPS
	_, w = job("randwrite")
	f.RandWriteIOPS = w.IOPS
	r, _ = job("latread")
	f.ReadP50us, f.ReadP99us = r.Lat.Percentile["50.000000"]/1000, r.Lat.Percentile["99.000000"]/1000
	_, w = job("latwrite")
	f.WriteP50us, f.WriteP99us = w.Lat.Percentile["50.000000"]/1000, w.Lat.Percentile["99.000000"]/1000
	return f, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}
