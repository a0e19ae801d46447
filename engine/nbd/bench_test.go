package nbd

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/strata-storage/strata/engine/blockdev"
)

const benchSize = 256 << 20

type benchWorkload struct {
	name  string
	bytes int64
	cmd   func(uri, src string) (string, []string)
}

var benchWorkloads = []benchWorkload{
	{"seq-read-nbdcopy", benchSize, func(uri, _ string) (string, []string) {
		return "nbdcopy", []string{"--connections=4", uri, "null:"}
	}},
	{"seq-write-nbdcopy", benchSize, func(uri, src string) (string, []string) {
		return "nbdcopy", []string{"--connections=4", src, uri}
	}},
	{"read-4k-qd16", 40000 * 4096, func(uri, _ string) (string, []string) {
		return "qemu-img", []string{"bench", "-f", "raw", "-c", "40000", "-d", "16", "-s", "4096", uri}
	}},
	{"write-4k-qd16", 40000 * 4096, func(uri, _ string) (string, []string) {
		return "qemu-img", []string{"bench", "-w", "-f", "raw", "-c", "40000", "-d", "16", "-s", "4096", uri}
	}},
	{"read-1m-qd8", 1024 << 20, func(uri, _ string) (string, []string) {
		return "qemu-img", []string{"bench", "-f", "raw", "-c", "1024", "-d", "8", "-s", "1M", uri}
	}},
}

// BenchmarkNBD compares this server with qemu-nbd serving the same raw file
// over a unix socket and loopback TCP, driven by nbdcopy (sequential, 4
// connections) and qemu-img bench (queue depth 16 or 8). Run with
//
//	go test ./engine/nbd/ -run '^$' -bench BenchmarkNBD -benchtime 5x
func BenchmarkNBD(b *testing.B) {
	for _, tool := range []struct{ name, pkg string }{{"nbdcopy", "libnbd-bin"}, {"qemu-img", "qemu-utils"}, {"qemu-nbd", "qemu-utils"}} {
		if _, err := exec.LookPath(tool.name); err != nil {
			b.Fatalf("%s not found in PATH: install the Debian package %s", tool.name, tool.pkg)
		}
	}
	dir := b.TempDir()
	src := filepath.Join(dir, "src.raw")
	data := make([]byte, benchSize)
	_, _ = rand.NewChaCha8([32]byte{1}).Read(data)
	if err := os.WriteFile(src, data, 0o644); err != nil {
		b.Fatal(err)
	}
	for _, server := range []string{"strata", "qemu-nbd"} {
		for _, network := range []string{"unix", "tcp"} {
			b.Run(server+"/"+network, func(b *testing.B) {
				img := filepath.Join(dir, server+".raw")
				if err := os.WriteFile(img, data, 0o644); err != nil {
					b.Fatal(err)
				}
				uri, cpu, stop := startBenchServer(b, server, network, img, filepath.Join(dir, server+".sock"))
				defer stop()
				for _, wl := range benchWorkloads {
					b.Run(wl.name, func(b *testing.B) {
						b.SetBytes(wl.bytes)
						cpu0 := cpu()
						defer func() {
							// Server CPU time per GiB moved: its efficiency,
							// independent of what the client costs.
							gib := float64(wl.bytes) * float64(b.N) / (1 << 30)
							b.ReportMetric((cpu()-cpu0).Seconds()/gib, "server-cpu-s/GiB")
						}()
						for b.Loop() {
							name, args := wl.cmd(uri, src)
							ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
							out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
							cancel()
							if err != nil {
								b.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
							}
						}
					})
				}
			})
		}
	}
}

// startBenchServer serves img as export "disk" and returns its URI and a
// function returning the server's CPU time so far.
func startBenchServer(b *testing.B, server, network, img, sock string) (uri string, cpu func() time.Duration, stop func()) {
	var l net.Listener
	var err error
	if network == "unix" {
		os.Remove(sock)
		l, err = net.Listen("unix", sock)
		uri = fmt.Sprintf("nbd+unix:///disk?socket=%s", sock)
	} else {
		l, err = net.Listen("tcp", "127.0.0.1:0")
		if err == nil {
			uri = fmt.Sprintf("nbd://%s/disk", l.Addr())
		}
	}
	if err != nil {
		b.Fatal(err)
	}
	if server == "strata" {
		f, err := blockdev.OpenFile(img, benchSize)
		if err != nil {
			b.Fatal(err)
		}
		logger, _ := logtest.NewNullLogger()
		srv := NewServer(Options{Logger: logger})
		if err := srv.AddExport("disk", f); err != nil {
			b.Fatal(err)
		}
		go func() { _ = srv.Serve(l) }()
		return uri, selfCPU, func() { srv.Close(); f.Close() }
	}
	// qemu-nbd gets its own listener address.
	addr := l.Addr().String()
	l.Close()
	args := []string{"-f", "raw", "-x", "disk", "-t", "-e", "16"}
	if network == "unix" {
		args = append(args, "-k", sock)
	} else {
		host, port, _ := net.SplitHostPort(addr)
		args = append(args, "-b", host, "-p", port)
	}
	cmd := exec.Command("qemu-nbd", append(args, img)...)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	dialAddr := addr
	if network == "unix" {
		dialAddr = sock
	}
	for i := 0; ; i++ {
		if c, err := net.Dial(network, dialAddr); err == nil {
			c.Close()
			break
		}
		if i > 500 {
			b.Fatal("qemu-nbd did not start listening")
		}
		time.Sleep(10 * time.Millisecond)
	}
	pid := cmd.Process.Pid
	return uri, func() time.Duration { return procCPU(pid) }, func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
}

// selfCPU is this process's CPU time (the in-process server, plus the
// benchmark loop, which mostly waits for its child).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is another process's CPU time from /proc/PID/stat.
func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	// Fields after the command: state is f[0]; utime and stime are 14 and
	// 15 in proc(5) numbering, i.e. f[11] and f[12].
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}
