// Command bench is the control-plane helper of scripts/bench-datapath: it
// creates volumes on running instance managers and drives snapshots and
// purge through engineapi, so the benchmark script needs no gRPC tool.
//
//	bench create-volume -im ADDR[,ADDR...] -name NAME -size BYTES -dir DIR
//	    one replica per instance manager (data in DIR/NAME-rN), the engine
//	    with an NBD frontend on the first; prints the NBD URI
//	bench snapshot -im ADDR -engine NAME -snapshot NAME
//	bench remove   -im ADDR -engine NAME -snapshot NAME
//	bench purge    -im ADDR -engine NAME
//	    purges and waits for every replica; prints the seconds it took
//	bench replica-latency -im ADDR -name VOLUME [-op write|read]
//	    each replica's count, p50 and p99 in µs of the engine's op on it,
//	    from the instance manager's metrics: "NAME COUNT P50 P99" lines
//	bench wait -im ADDR[,ADDR...]
//	    waits until every instance manager answers
//	bench free-ports N
//	    prints N free TCP ports on 127.0.0.1, one a line
//	bench identities -tls DIR -nodes N
//	    plays the managers' part for certificates: a new CA, DIR/node<i>
//	    for instance manager i's --tls-dir, DIR/manager for this tool
//
// Every command that calls instance managers takes -tls DIR too.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/strata-storage/strata/engineapi"
	"github.com/strata-storage/strata/engineapi/impb"
	"github.com/strata-storage/strata/internal/devtools/benchvol"
	"github.com/strata-storage/strata/internal/pki"
)

// identities writes a CA's instance-manager identities and this tool's.
func identities(args []string) error {
	fs := flag.NewFlagSet("identities", flag.ExitOnError)
	dir := fs.String("tls", "", "directory to write")
	nodes := fs.Int("nodes", 1, "instance managers")
	_ = fs.Parse(args)
	if *dir == "" {
		return errors.New("-tls is required")
	}
	ca, err := pki.NewAuthority()
	if err != nil {
		return err
	}
	for i := 1; i <= *nodes; i++ {
		node := "node" + strconv.Itoa(i)
		if err := ca.WriteDir(filepath.Join(*dir, node), pki.Identity{Component: pki.ComponentInstanceManager, Node: node}); err != nil {
			return err
		}
	}
	return ca.WriteDir(filepath.Join(*dir, "manager"), pki.Identity{Component: pki.ComponentManager, Node: "bench"})
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: bench create-volume|snapshot|remove|purge [flags]")
		os.Exit(2)
	}
	if os.Args[1] == "identities" {
		if err := identities(os.Args[2:]); err != nil {
			fail(err)
		}
		return
	}
	if os.Args[1] == "free-ports" {
		if err := freePorts(os.Args[2:]); err != nil {
			fail(err)
		}
		return
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	tlsDir := fs.String("tls", "", "directory written by `bench identities`")
	ims := fs.String("im", "", "instance-manager gRPC address(es), comma-separated; the engine runs on the first")
	name := fs.String("name", "", "volume name (create-volume)")
	size := fs.Int64("size", 0, "volume size in bytes (create-volume)")
	dir := fs.String("dir", "", "directory for replica data (create-volume)")
	engine := fs.String("engine", "", "engine instance name")
	snapshot := fs.String("snapshot", "", "snapshot name")
	op := fs.String("op", "write", "operation (replica-latency)")
	timeout := fs.Duration("timeout", 10*time.Minute, "overall timeout")
	_ = fs.Parse(os.Args[2:])

	addrs := strings.Split(*ims, ",")
	if *ims == "" {
		fail(errors.New("-im is required"))
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	clients := make([]*engineapi.Client, len(addrs))
	for i, a := range addrs {
		c, err := engineapi.NewClient(a, 0, pki.ClientConfig(pki.NewDirSource(filepath.Join(*tlsDir, "manager")),
			pki.ComponentInstanceManager))
		if err != nil {
			fail(err)
		}
		defer c.Close()
		clients[i] = c
	}

	var err error
	switch os.Args[1] {
	case "create-volume":
		var inst *impb.Instance
		inst, err = benchvol.Create(ctx, clients, *name, *size, *dir, "nbd")
		if err == nil {
			fmt.Println(inst.FrontendEndpoint)
		}
	case "replica-latency":
		err = replicaLatency(ctx, clients[0], *name, *op)
	case "wait":
		for _, c := range clients {
			for {
				if _, err = c.InstanceList(ctx); err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	case "snapshot":
		_, err = clients[0].SnapshotCreate(ctx, *engine, *snapshot, true, nil, 0)
	case "remove":
		err = clients[0].SnapshotRemove(ctx, *engine, *snapshot)
	case "purge":
		var secs float64
		secs, err = purge(ctx, clients[0], *engine)
		if err == nil {
			fmt.Printf("%.4f\n", secs)
		}
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench:", err)
	os.Exit(1)
}

func freePorts(args []string) error {
	n := 1
	if len(args) > 0 {
		var err error
		if n, err = strconv.Atoi(args[0]); err != nil || n < 1 {
			return fmt.Errorf("free-ports: bad count %q", args[0])
		}
	}
	// Hold every listener until all are picked, so no port comes twice.
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		ls = append(ls, l)
		fmt.Println(l.Addr().(*net.TCPAddr).Port)
	}
	return nil
}

// purge starts a purge and polls until every replica reports it complete.
func purge(ctx context.Context, c *engineapi.Client, engine string) (float64, error) {
	start := time.Now()
	if err := c.SnapshotPurge(ctx, engine); err != nil {
		return 0, err
	}
	for {
		st, err := c.SnapshotPurgeStatus(ctx, engine)
		if err != nil {
			return 0, err
		}
		done := len(st) > 0
		for name, s := range st {
			if s.State == "error" {
				return 0, fmt.Errorf("purge on %s: %s", name, s.Error)
			}
			if s.IsPurging || s.State != "complete" {
				done = false
			}
		}
		if done {
			return time.Since(start).Seconds(), nil
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}
