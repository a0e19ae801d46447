package benchbackup

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"time"
)

// results are one run's figures; print renders them.
type results struct {
	cfg           config
	volumeBytes   int64
	changedChunks int64

	fill, nbdcopy, put, get phase
	lateFill                phase // a fill just before the restores
	full, incr              phase
	restoreFull             phase
	restoreIncr             phase
	when                    time.Time
}

func (p phase) mib() float64  { return float64(p.bytes) / (1 << 20) }
func (p phase) mibs() float64 { return p.mib() / p.d.Seconds() }

func total(reqs map[string]int64) int64 {
	var n int64
	for _, v := range reqs {
		n += v
	}
	return n
}

// requestsText is "total (PUT n, GET n, …)", kinds in a fixed order.
func requestsText(reqs map[string]int64) string {
	if reqs == nil {
		return "-"
	}
	order := []string{"PUT", "GET", "HEAD", "LIST", "DELETE"}
	var parts []string
	for _, k := range order {
		if reqs[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, reqs[k]))
		}
	}
	var other []string
	for k := range reqs {
		if !slices.Contains(order, k) {
			other = append(other, k)
		}
	}
	slices.Sort(other)
	for _, k := range other {
		parts = append(parts, fmt.Sprintf("%s %d", k, reqs[k]))
	}
	return fmt.Sprintf("%d (%s)", total(reqs), strings.Join(parts, ", "))
}

func ratio(a, b phase) string {
	if b.d == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fx", a.mibs()/b.mibs())
}

func (r *results) print(w io.Writer) {
	c := r.cfg
	packs := r.put.objects
	fmt.Fprintf(w, "\nbackup/restore of a %d MiB volume of random data (%d replicas, NBD) to versitygw on loopback; "+
		"%d workers and S3 streams; %d cores; %s\n", c.sizeMiB, c.replicas, c.concurrency, runtime.NumCPU(),
		r.when.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(w, "incremental: %d of %d 1 MiB blocks (%d%%) rewritten at random offsets; baselines and restores best of %d runs, "+
		"the full backup best of %[4]d (all but one to targets of their own), the incremental one; ratios are MiB/s over the baseline's (backup: nbdcopy read, raw PUT; restore: nbdcopy read, raw GET)\n\n",
		r.changedChunks, r.volumeBytes>>20, c.changePercent, c.runs)
	fmt.Fprintf(w, "%-44s %7s %8s %8s %9s %7s %8s  %s\n", "operation", "MiB", "seconds", "MiB/s", "/nbdcopy", "/S3",
		"objects", "requests")
	row := func(label string, p phase, vsNBD, vsS3 string) {
		objs := "-"
		if p.objects >= 0 {
			objs = fmt.Sprint(p.objects)
		}
		fmt.Fprintf(w, "%-44s %7.0f %8.2f %8.1f %9s %7s %8s  %s\n", label, p.mib(), p.d.Seconds(), p.mibs(),
			vsNBD, vsS3, objs, requestsText(p.requests))
	}
	row("nbdcopy volume -> local file (baseline)", r.nbdcopy, "1.00x", "-")
	row("nbdcopy local file -> volume (the fill)", r.fill, ratio(r.fill, r.nbdcopy), "-")
	row(fmt.Sprintf("S3 PUT %d x %d MiB (baseline)", packs, r.put.bytes/max(packs, 1)>>20), r.put, "-", "1.00x")
	row(fmt.Sprintf("S3 GET %d x %d MiB (baseline)", packs, r.get.bytes/max(packs, 1)>>20), r.get, "-", "1.00x")
	row("full backup (SnapshotBackup)", r.full, ratio(r.full, r.nbdcopy), ratio(r.full, r.put))
	row("incremental backup, changed blocks", r.incr, ratio(r.incr, r.nbdcopy), ratio(r.incr, r.put))
	row("restore of the full backup (BackupRestore)", r.restoreFull, ratio(r.restoreFull, r.nbdcopy), ratio(r.restoreFull, r.get))
	row("restore of the incremental backup", r.restoreIncr, ratio(r.restoreIncr, r.nbdcopy), ratio(r.restoreIncr, r.get))

	gib := func(b int64) float64 { return float64(b) / (1 << 30) }
	fullGiB, incrGiB := gib(r.full.bytes), gib(r.incr.bytes)
	fmt.Fprintf(w, "\nper GiB backed up: full %.0f objects, %.0f requests; incremental %.0f objects, %.0f requests per GiB of changed blocks "+
		"(Longhorn: 512 objects and at least as many PUTs per GiB)\n",
		float64(r.full.objects)/fullGiB, float64(total(r.full.requests))/fullGiB,
		float64(r.incr.objects)/incrGiB, float64(total(r.incr.requests))/incrGiB)
	fmt.Fprintf(w, "per GiB restored: full %.0f requests, incremental %.0f requests\n",
		float64(total(r.restoreFull.requests))/gib(r.restoreFull.bytes), float64(total(r.restoreIncr.requests))/gib(r.restoreIncr.bytes))
	fs, is := r.full.status, r.incr.status
	fmt.Fprintf(w, "job status: full read %d chunks, %d new, %.0f MiB uploaded; incremental read %d, %d new, %.0f MiB uploaded, "+
		"the incremental's whole run %.2f s for the %d MiB volume (%.0f MiB/s of volume)\n",
		fs.ReadChunks, fs.NewChunks, float64(fs.NewBytes)/(1<<20), is.ReadChunks, is.NewChunks, float64(is.NewBytes)/(1<<20),
		r.incr.d.Seconds(), r.volumeBytes>>20, float64(r.volumeBytes>>20)/r.incr.d.Seconds())
	fmt.Fprintf(w, "restore over nbdcopy into a new volume (the fill: the same engine write path, fresh replicas): full %s, incremental %s; "+
		"over the fill just before the restores (%.0f MiB/s): full %s, incremental %s\n",
		ratio(r.restoreFull, r.fill), ratio(r.restoreIncr, r.fill), r.lateFill.mibs(),
		ratio(r.restoreFull, r.lateFill), ratio(r.restoreIncr, r.lateFill))
	r.printCPU(w)
	fmt.Fprintln(w, "restored volumes: SHA-256 equal to the source's at s1 and at s2")
}

// printCPU shows where the cores went in each phase: with every process on
// the same cores, a phase's CPU seconds per GiB bound its MiB/s, so the
// ratio of two phases' CPU bounds the ratio of their throughputs.
func (r *results) printCPU(w io.Writer) {
	perGiB := func(d time.Duration, p phase) float64 { return d.Seconds() / (float64(p.bytes) / (1 << 30)) }
	line := func(label, client string, p phase, c time.Duration) string {
		return fmt.Sprintf("%s %.2f (S3 server %.2f, %s %.2f)", label, perGiB(p.cpu.total(), p),
			perGiB(p.cpu.server, p), client, perGiB(c, p))
	}
	fmt.Fprintf(w, "CPU seconds per GiB: %s; %s; %s; %s; the fill just before the restores %.2f (instance managers %.2f, nbdcopy %.2f)\n",
		line("raw PUT", "client", r.put, r.put.cpu.bench), line("full backup", "instance managers", r.full, r.full.cpu.managers),
		line("raw GET", "client", r.get, r.get.cpu.bench), line("restore of the full backup", "instance managers", r.restoreFull, r.restoreFull.cpu.managers),
		perGiB(r.lateFill.cpu.total(), r.lateFill), perGiB(r.lateFill.cpu.managers, r.lateFill), perGiB(r.lateFill.cpu.bench, r.lateFill))
	busy := func(p phase) float64 {
		return 100 * p.cpu.total().Seconds() / p.d.Seconds() / float64(runtime.NumCPU())
	}
	fmt.Fprintf(w, "the cores' bound (one phase's CPU per GiB over the other's): full backup /PUT %.2fx, restore of the full backup /the fill before it %.2fx; "+
		"CPU busy (of %d cores): raw PUT %.0f%%, full backup %.0f%%, the fill %.0f%%, the restore %.0f%%\n",
		bound(r.put, r.full), bound(r.lateFill, r.restoreFull), runtime.NumCPU(),
		busy(r.put), busy(r.full), busy(r.lateFill), busy(r.restoreFull))
}

// bound is base's CPU per byte over p's: what p /base can reach when both
// are bound by the same cores.
func bound(base, p phase) float64 {
	return base.cpu.total().Seconds() / base.mib() * p.mib() / p.cpu.total().Seconds()
}
