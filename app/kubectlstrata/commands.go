package kubectlstrata

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/urfave/cli/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/types"
)

// Main runs kubectl strata and exits non-zero on error.
func Main(args []string) {
	if err := NewCommand().Run(context.Background(), args); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// NewCommand is the kubectl strata command line.
func NewCommand() *cli.Command {
	root := &cli.Command{
		Name:  "kubectl strata",
		Usage: "Strata's actions: volumes, snapshots, attachments, backups, backing images, snapshot quotas",
		Description: `Talks to Strata's REST API on a manager (found from the Strata Nodes, or --api),
trusting Strata's CA (ConfigMap strata-ca-bundle) and sending the kubeconfig's token.

Examples:
  kubectl strata volume create data --size 1Gi --replicas 2
  kubectl strata volume ls
  kubectl strata volume attach data --node node-1 --keep
  kubectl strata snapshot create data before-upgrade
  kubectl strata snapshot ls data -o yaml
  kubectl strata quota set apps 10Gi
  kubectl strata quota set apps 5Gi --vm vm1
  kubectl strata quota show apps
  kubectl strata backup create data nightly-1; kubectl strata backup restore nightly-1 data-2
  kubectl strata image create golden --upload; kubectl strata image upload golden disk.qcow2`,
		EnableShellCompletion: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kubeconfig", Usage: "the kubeconfig (default: $KUBECONFIG or ~/.kube/config)"},
			&cli.StringFlag{Name: "context", Usage: "the kubeconfig context"},
			&cli.StringFlag{Name: "token", Usage: "a bearer token for the API, instead of the kubeconfig user's", Sources: cli.EnvVars("STRATA_TOKEN")},
			&cli.StringFlag{Name: "api", Usage: "the API's address, https://host[:port] (default: a ready Strata node's)"},
			&cli.StringFlag{Name: "strata-namespace", Value: types.DefaultNamespace, Usage: "where Strata runs"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Usage: "json or yaml (default: a table)"},
		},
		Commands: []*cli.Command{volumeCommand(), snapshotCommand(), backupCommand(), imageCommand(), quotaCommand()},
	}
	kubectlStyle(root)
	return root
}

// kubectlVerbs are the names a kubectl user types for our short ones.
var kubectlVerbs = map[string]string{"ls": "list", "rm": "delete"}

// kubectlStyle gives every command in the tree its kubectl name as an
// alias, and every command that only groups others an action that names
// an unknown subcommand as an error (urfave/cli's own says "No help topic").
func kubectlStyle(cmd *cli.Command) {
	if verb, ok := kubectlVerbs[cmd.Name]; ok && !slices.Contains(cmd.Aliases, verb) {
		cmd.Aliases = append(cmd.Aliases, verb)
	}
	if len(cmd.Commands) == 0 {
		return
	}
	if cmd.Action == nil {
		cmd.Action = unknownSubcommand
	}
	for _, sub := range cmd.Commands {
		kubectlStyle(sub)
	}
}

// unknownSubcommand shows a group's help when no subcommand is given and
// is an error naming the one given otherwise.
func unknownSubcommand(ctx context.Context, cmd *cli.Command) error {
	if cmd.Args().Len() == 0 {
		if cmd.Root() == cmd {
			return cli.ShowRootCommandHelp(cmd)
		}
		return cli.ShowSubcommandHelp(cmd)
	}
	var names []string
	for _, sub := range cmd.VisibleCommands() {
		if sub.Name != "help" {
			names = append(names, sub.Name)
		}
	}
	return fmt.Errorf("unknown command %q for %q: it has %s (see %s --help)",
		cmd.Args().First(), cmd.FullName(), strings.Join(names, ", "), cmd.FullName())
}

// session is what every action works with.
type session struct {
	*client
	print printer
	cmd   *cli.Command
}

// action wraps a command's work: the client and the printer are made first.
func action(do func(ctx context.Context, s *session) error) cli.ActionFunc {
	return func(ctx context.Context, cmd *cli.Command) error {
		// urfave/cli sets Writer and ErrWriter (stdout, stderr) when it runs.
		p := printer{out: cmd.Root().Writer, errOut: cmd.Root().ErrWriter, format: cmd.String("output"), now: time.Now}
		if err := p.check(); err != nil {
			return err
		}
		if err := checkArgs(cmd); err != nil {
			return err
		}
		c, err := newClient(ctx, cmd)
		if err != nil {
			return err
		}
		return do(ctx, &session{client: c, print: p, cmd: cmd})
	}
}

// checkArgs refuses a command line that lacks an argument its usage names
// (NAME, VOLUME NAME; "[NAME]" is optional) before anything is read from
// the cluster, so the error is the missing argument, not the cluster's.
func checkArgs(cmd *cli.Command) error {
	for n, word := range strings.Fields(cmd.ArgsUsage) {
		if strings.HasPrefix(word, "[") {
			return nil
		}
		if _, err := arg(cmd, n, strings.TrimSuffix(word, "...")); err != nil {
			return err
		}
	}
	return nil
}

// arg is the n-th argument, which must be there.
func arg(cmd *cli.Command, n int, name string) (string, error) {
	if cmd.Args().Len() <= n {
		return "", fmt.Errorf("missing %s: see %s --help", name, cmd.FullName())
	}
	return cmd.Args().Get(n), nil
}

// twoArgs are the first two arguments, which must be there.
func twoArgs(cmd *cli.Command, first, second string) (string, string, error) {
	a, err := arg(cmd, 0, first)
	if err != nil {
		return "", "", err
	}
	b, err := arg(cmd, 1, second)
	return a, b, err
}

func volumeCommand() *cli.Command {
	return &cli.Command{Name: "volume", Aliases: []string{"vol"}, Usage: "list, create, attach, detach, expand, revert, delete volumes",
		Commands: []*cli.Command{
			{Name: "ls", Usage: "list the volumes", Action: action(listVolumes)},
			{Name: "create", Usage: "create a volume", ArgsUsage: "NAME",
				Description: "kubectl strata volume create data --size 1Gi --replicas 2",
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "size", Required: true, Usage: "a quantity: 1Gi"},
					&cli.IntFlag{Name: "replicas", Usage: "replica count (default: the default-replica-count setting)"},
					&cli.StringFlag{Name: "backing-image", Usage: "a BackingImage the volume starts from"},
					&cli.StringFlag{Name: "from-backup", Usage: "a Backup to restore into it"},
					&cli.StringFlag{Name: "data-source", Usage: "vol://<volume> or snap://<volume>/<snapshot> to clone"},
					&cli.BoolFlag{Name: "wait", Usage: "with --data-source or --from-backup: follow the fill to its end (a progress line on a terminal)"},
				}, Action: action(createVolume)},
			{Name: "rm", Usage: "delete a volume (refused while attached)", ArgsUsage: "NAME", Action: action(deleteNamed("/v1/volumes/", "volume"))},
			{Name: "expand", Usage: "grow a volume", ArgsUsage: "NAME",
				Flags:  []cli.Flag{&cli.StringFlag{Name: "size", Required: true, Usage: "the new size: 2Gi"}},
				Action: action(expandVolume)},
			{Name: "attach", Usage: "attach a volume to a node through a ticket the API keeps for this client", ArgsUsage: "NAME",
				Description: `The ticket lasts --ttl unless renewed. With --keep the command renews it until
interrupted (Ctrl-C), then detaches; without, it prints the ticket to renew (attach
again with --ticket) or detach.

  kubectl strata volume attach data --node node-1 --keep`,
				Flags: []cli.Flag{
					&cli.StringFlag{Name: "node", Required: true, Usage: "the node"},
					&cli.BoolFlag{Name: "no-frontend", Usage: "attach without an NBD export (maintenance)"},
					&cli.DurationFlag{Name: "ttl", Value: 5 * time.Minute, Usage: "how long the ticket lasts unless renewed (10s–24h)"},
					&cli.StringFlag{Name: "ticket", Usage: "renew this ticket instead of making one"},
					&cli.BoolFlag{Name: "keep", Usage: "renew until interrupted, then detach"},
				}, Action: action(attachVolume)},
			{Name: "revert", Usage: "revert a detached volume to one of its snapshots (later snapshots stay)", ArgsUsage: "NAME",
				Description: "kubectl strata volume revert data --snapshot before-upgrade",
				Flags:       []cli.Flag{&cli.StringFlag{Name: "snapshot", Required: true, Usage: "the snapshot"}},
				Action:      action(revertVolume)},
			{Name: "detach", Usage: "remove an attach ticket", ArgsUsage: "NAME",
				Flags:  []cli.Flag{&cli.StringFlag{Name: "ticket", Required: true, Usage: "the ticket attach printed"}},
				Action: action(detachVolume)},
		}}
}

func listVolumes(ctx context.Context, s *session) error {
	return listTable(ctx, s, "GET", "/v1/volumes", []string{"NAME", "SIZE", "REPLICAS", "STATE", "ROBUSTNESS", "NODE", "AGE"},
		func(v v1beta1.Volume) []string {
			return []string{v.Name, v.Spec.Size.String(), strconv.Itoa(int(v.Spec.NumberOfReplicas)), orNone(string(v.Status.State)),
				orNone(string(v.Status.Robustness)), orNone(v.Status.CurrentNodeID), s.print.age(v.CreationTimestamp)}
		})
}

func createVolume(ctx context.Context, s *session) error {
	name, err := arg(s.cmd, 0, "NAME")
	if err != nil {
		return err
	}
	body := map[string]any{"name": name, "size": s.cmd.String("size"), "numberOfReplicas": s.cmd.Int("replicas"),
		"backingImage": s.cmd.String("backing-image"), "fromBackup": s.cmd.String("from-backup"), "dataSource": s.cmd.String("data-source")}
	var v v1beta1.Volume
	if err := s.call(ctx, "POST", "/v1/volumes", body, &v); err != nil {
		return err
	}
	if err := s.done(v, "volume/%s created", v.Name); err != nil || !s.cmd.Bool("wait") {
		return err
	}
	switch {
	case v.Spec.DataSource != "":
		return s.waitFilled(ctx, v.Name, "clone")
	case v.Spec.FromBackup != "":
		return s.waitFilled(ctx, v.Name, "restore")
	}
	return nil
}

// deleteNamed deletes the object NAME at path+NAME.
func deleteNamed(path, noun string) func(context.Context, *session) error {
	return func(ctx context.Context, s *session) error {
		name, err := arg(s.cmd, 0, "NAME")
		if err != nil {
			return err
		}
		if err := s.call(ctx, "DELETE", path+name, nil, nil); err != nil {
			return err
		}
		return s.done(nil, "%s/%s deleted", noun, name)
	}
}

func expandVolume(ctx context.Context, s *session) error {
	name, err := arg(s.cmd, 0, "NAME")
	if err != nil {
		return err
	}
	var v v1beta1.Volume
	if err := s.call(ctx, "POST", "/v1/volumes/"+name+"?action=expand", map[string]string{"size": s.cmd.String("size")}, &v); err != nil {
		return err
	}
	return s.done(v, "volume/%s expanded to %s", name, v.Spec.Size.String())
}

// attachReply is what attach answers.
type attachReply struct {
	TicketID       string    `json:"ticketID"`
	LeaseExpiresAt time.Time `json:"leaseExpiresAt"`
}

func attachVolume(ctx context.Context, s *session) error {
	name, err := arg(s.cmd, 0, "NAME")
	if err != nil {
		return err
	}
	body := map[string]any{"node": s.cmd.String("node"), "disableFrontend": s.cmd.Bool("no-frontend"),
		"ttlSeconds": int64(s.cmd.Duration("ttl").Seconds()), "ticketID": s.cmd.String("ticket")}
	var reply attachReply
	if err := s.call(ctx, "POST", "/v1/volumes/"+name+"?action=attach", body, &reply); err != nil {
		return err
	}
	if err := s.done(reply, "volume/%s: ticket %s on %s, lasts until %s unless renewed",
		name, reply.TicketID, s.cmd.String("node"), reply.LeaseExpiresAt.Local().Format(time.RFC3339)); err != nil || !s.cmd.Bool("keep") {
		return err
	}
	return s.keep(ctx, name, body, reply.TicketID)
}

// keep renews the ticket at a third of its TTL until interrupted, then
// removes it.
func (s *session) keep(ctx context.Context, volume string, body map[string]any, ticket string) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	body["ticketID"] = ticket
	tick := time.NewTicker(s.cmd.Duration("ttl") / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			// Detach with a context of its own: ctx is the one interrupted.
			detach, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.call(detach, "POST", "/v1/volumes/"+volume+"?action=detach", map[string]string{"ticketID": ticket}, nil); err != nil {
				return err
			}
			return s.line("volume/%s: ticket %s removed", volume, ticket)
		case <-tick.C:
			if err := s.call(ctx, "POST", "/v1/volumes/"+volume+"?action=attach", body, nil); err != nil && ctx.Err() == nil {
				return fmt.Errorf("renewing ticket %s: %w", ticket, err)
			}
		}
	}
}

func revertVolume(ctx context.Context, s *session) error {
	name, err := arg(s.cmd, 0, "NAME")
	if err != nil {
		return err
	}
	snapshot := s.cmd.String("snapshot")
	var v v1beta1.Volume
	if err := s.call(ctx, "POST", "/v1/volumes/"+name+"?action=revert", map[string]string{"snapshot": snapshot}, &v); err != nil {
		return err
	}
	return s.done(v, "volume/%s reverted to snapshot/%s", name, snapshot)
}

func detachVolume(ctx context.Context, s *session) error {
	name, err := arg(s.cmd, 0, "NAME")
	if err != nil {
		return err
	}
	ticket := s.cmd.String("ticket")
	if err := s.call(ctx, "POST", "/v1/volumes/"+name+"?action=detach", map[string]string{"ticketID": ticket}, nil); err != nil {
		return err
	}
	return s.done(nil, "volume/%s: ticket %s removed", name, ticket)
}

func snapshotCommand() *cli.Command {
	return &cli.Command{Name: "snapshot", Aliases: []string{"snap"}, Usage: "list, take and delete a volume's snapshots",
		Commands: []*cli.Command{
			{Name: "ls", Usage: "list a volume's snapshots", ArgsUsage: "VOLUME", Action: action(listSnapshots)},
			{Name: "create", Usage: "take a snapshot", ArgsUsage: "VOLUME [NAME]",
				Flags:  []cli.Flag{&cli.StringSliceFlag{Name: "label", Usage: "key=value, repeatable"}},
				Action: action(createSnapshot)},
			{Name: "rm", Usage: "delete a snapshot", ArgsUsage: "VOLUME NAME", Action: action(deleteSnapshot)},
		}}
}

func listSnapshots(ctx context.Context, s *session) error {
	volume, err := arg(s.cmd, 0, "VOLUME")
	if err != nil {
		return err
	}
	return listTable(ctx, s, "POST", "/v1/volumes/"+volume+"?action=snapshotCRList", []string{"NAME", "SIZE", "READY", "USER", "PARENT", "AGE"},
		func(sn v1beta1.Snapshot) []string {
			return []string{sn.Name, size(sn.Status.Size), strconv.FormatBool(sn.Status.ReadyToUse),
				strconv.FormatBool(sn.Status.UserCreated), orNone(sn.Status.Parent), s.print.age(sn.CreationTimestamp)}
		})
}

func createSnapshot(ctx context.Context, s *session) error {
	volume, err := arg(s.cmd, 0, "VOLUME")
	if err != nil {
		return err
	}
	labels := map[string]string{}
	for _, kv := range s.cmd.StringSlice("label") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q: want key=value", kv)
		}
		labels[k] = v
	}
	var snap v1beta1.Snapshot
	body := map[string]any{"name": s.cmd.Args().Get(1), "labels": labels}
	if err := s.call(ctx, "POST", "/v1/volumes/"+volume+"?action=snapshotCRCreate", body, &snap); err != nil {
		return err
	}
	return s.done(snap, "snapshot/%s of volume/%s created", snap.Name, volume)
}

func deleteSnapshot(ctx context.Context, s *session) error {
	volume, name, err := twoArgs(s.cmd, "VOLUME", "NAME")
	if err != nil {
		return err
	}
	if err := s.call(ctx, "POST", "/v1/volumes/"+volume+"?action=snapshotCRDelete", map[string]string{"name": name}, nil); err != nil {
		return err
	}
	return s.done(nil, "snapshot/%s of volume/%s deleted", name, volume)
}

func quotaCommand() *cli.Command {
	vm := &cli.StringFlag{Name: "vm", Usage: "a VirtualMachine of the namespace: its quota instead of the namespace's"}
	return &cli.Command{Name: "quota", Usage: "show, set and remove snapshot space quotas",
		Commands: []*cli.Command{
			{Name: "show", Usage: "a namespace's quotas and usage", ArgsUsage: "NAMESPACE", Action: action(showQuota)},
			{Name: "set", Usage: "set a quota", ArgsUsage: "NAMESPACE SIZE", Flags: []cli.Flag{vm},
				Description: "kubectl strata quota set apps 10Gi\nkubectl strata quota set apps 5Gi --vm vm1",
				Action:      action(setQuota)},
			{Name: "rm", Usage: "remove a quota", ArgsUsage: "NAMESPACE", Flags: []cli.Flag{vm}, Action: action(removeQuota)},
		}}
}

func quotaPath(namespace, vm, action string) string {
	if vm != "" {
		return "/v1/virtualmachines/" + namespace + "/" + vm + "?action=" + action
	}
	return "/v1/namespaces/" + namespace + "?action=" + action
}

func setQuota(ctx context.Context, s *session) error {
	namespace, size, err := twoArgs(s.cmd, "NAMESPACE", "SIZE")
	if err != nil {
		return err
	}
	vm := s.cmd.String("vm")
	if err := s.call(ctx, "POST", quotaPath(namespace, vm, "updateResourceQuota"),
		map[string]string{"totalSnapshotSizeQuota": size}, nil); err != nil {
		return err
	}
	return s.done(nil, "quota of %s set to %s", quotaSubject(namespace, vm), size)
}

func removeQuota(ctx context.Context, s *session) error {
	namespace, err := arg(s.cmd, 0, "NAMESPACE")
	if err != nil {
		return err
	}
	vm := s.cmd.String("vm")
	if err := s.call(ctx, "POST", quotaPath(namespace, vm, "deleteResourceQuota"), nil, nil); err != nil {
		return err
	}
	return s.done(nil, "quota of %s removed", quotaSubject(namespace, vm))
}

func quotaSubject(namespace, vm string) string {
	if vm != "" {
		return "virtualmachine " + namespace + "/" + vm
	}
	return "namespace " + namespace
}

// showQuota reads the ResourceQuota from the API server (the REST API
// writes quotas; their figures are the CR's status).
func showQuota(ctx context.Context, s *session) error {
	namespace, err := arg(s.cmd, 0, "NAMESPACE")
	if err != nil {
		return err
	}
	rq, err := s.strata.StrataV1beta1().ResourceQuotas(namespace).Get(ctx, v1beta1.DefaultResourceQuotaName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return s.line("namespace %s has no snapshot quota", namespace)
	}
	if err != nil {
		return err
	}
	if done, err := s.print.objects(rq); done {
		return err
	}
	limit, st := rq.Spec.SnapshotLimit, rq.Status.SnapshotLimitStatus
	rows := [][]string{{"namespace/" + namespace, quantity(st.NamespaceTotalSnapshotSizeUsage), quantity(limit.NamespaceTotalSnapshotSizeQuota)}}
	for _, vm := range slices.Sorted(maps.Keys(limit.VMTotalSnapshotSizeQuota)) {
		q, used := limit.VMTotalSnapshotSizeQuota[vm], st.VMTotalSnapshotSizeUsage[vm]
		rows = append(rows, []string{"virtualmachine/" + vm, quantity(&used), quantity(&q)})
	}
	return s.print.table([]string{"SUBJECT", "USED", "QUOTA"}, rows)
}

func quantity(q *resource.Quantity) string {
	if q == nil {
		return "<none>"
	}
	return q.String()
}

// done prints obj with -o, else the line.
func (s *session) done(obj any, format string, args ...any) error {
	if obj != nil {
		if done, err := s.print.objects(obj); done {
			return err
		}
	}
	return s.line(format, args...)
}

func (s *session) line(format string, args ...any) error {
	_, err := fmt.Fprintf(s.print.out, format+"\n", args...)
	return err
}
