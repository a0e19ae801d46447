package benchpodstart

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// csiMethods are the CSI calls of a Pod's start, in the order they run.
var csiMethods = []string{"CreateVolume", "ControllerPublishVolume", "NodeStageVolume", "NodePublishVolume"}

var (
	csiLine  = regexp.MustCompile(`msg="CSI call( failed)?"`)
	csiField = regexp.MustCompile(`\b(method|took|volume|name)=("[^"]*"|\S+)`)
)

// readCSILogs adds up the durations of the sample's CSI calls (and counts
// the failed ones) from the CSI processes' logs: each logs its calls with
// the volume and how long they took (csi/driver.go logCalls).
func (b *bench) readCSILogs(ctx context.Context, s *sample) error {
	pv, err := b.kube.CoreV1().PersistentVolumes().Get(ctx, s.pv, metav1.GetOptions{})
	if err != nil {
		return err
	}
	handle := s.pv
	if pv.Spec.CSI != nil {
		handle = pv.Spec.CSI.VolumeHandle
	}
	files, err := filepath.Glob(filepath.Join(b.logsDir, "csi-*.log"))
	if err != nil {
		return err
	}
	s.csi = map[string]time.Duration{}
	for _, f := range files {
		if err := scanCSILog(f, handle, s.pv, s); err != nil {
			return err
		}
	}
	return nil
}

func scanCSILog(path, handle, pvName string, s *sample) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		m := csiLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		fields := map[string]string{}
		for _, f := range csiField.FindAllStringSubmatch(line, -1) {
			fields[f[1]] = strings.Trim(f[2], `"`)
		}
		if fields["volume"] != handle && fields["name"] != pvName {
			continue
		}
		if m[1] != "" {
			s.failed++
			continue
		}
		method := fields["method"][strings.LastIndexByte(fields["method"], '/')+1:]
		if took, err := time.ParseDuration(fields["took"]); err == nil {
			s.csi[method] += took
		}
	}
	return sc.Err()
}

// printTable prints, per kind of claim, the median and the slowest sample
// of each step (time since the apply) and of each CSI call's duration.
func printTable(out io.Writer, samples []*sample) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := []string{"claim", "samples"}
	for _, n := range stepNames {
		header = append(header, n)
	}
	for _, m := range csiMethods {
		header = append(header, m)
	}
	header = append(header, "failed CSI calls")
	fmt.Fprintln(out, "\nbench-pod-start: seconds from the apply of claim + Pod to each step (median / slowest), and each CSI call's duration")
	fmt.Fprintln(tw, strings.Join(header, "\t")+"\t")
	for _, kind := range []claimKind{kindNew, kindRestore, kindClone} {
		var of []*sample
		for _, s := range samples {
			if s.kind == kind {
				of = append(of, s)
			}
		}
		if len(of) == 0 {
			continue
		}
		row := []string{string(kind), fmt.Sprint(len(of))}
		for st := range numSteps {
			row = append(row, medianMax(of, func(s *sample) time.Duration { return s.at(st) }))
		}
		for _, m := range csiMethods {
			row = append(row, medianMax(of, func(s *sample) time.Duration { return s.csi[m] }))
		}
		failed := 0
		for _, s := range of {
			failed += s.failed
		}
		row = append(row, fmt.Sprint(failed))
		fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
	}
	_ = tw.Flush()
}

func medianMax(samples []*sample, f func(*sample) time.Duration) string {
	var ds []time.Duration
	for _, s := range samples {
		if d := f(s); d >= 0 {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return "—"
	}
	slices.Sort(ds)
	return fmt.Sprintf("%.2f / %.2f", ds[len(ds)/2].Seconds(), ds[len(ds)-1].Seconds())
}
