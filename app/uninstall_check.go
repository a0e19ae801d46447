package app

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

// UninstallCheckCommand is `strata-manager uninstall-check`, the Helm
// chart's pre-delete hook: uninstalling while volumes exist would strand
// their data on the nodes (replica directories nobody deletes) and their
// PersistentVolumes without a driver, so it refuses and names them.
func UninstallCheckCommand() *cli.Command {
	return &cli.Command{
		Name:  "uninstall-check",
		Usage: "exit non-zero, naming them, while Strata volumes exist (the chart's pre-delete hook)",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file; empty means in-cluster", Sources: cli.EnvVars("KUBECONFIG")},
			&cli.StringFlag{Name: "namespace", Value: types.DefaultNamespace, Usage: "namespace of Strata's objects",
				Sources: cli.EnvVars("STRATA_NAMESPACE")},
		},
		Action: func(ctx context.Context, cmd *cli.Command) error {
			_, strata, _, err := newClients(cmd.String("kubeconfig"), "strata-uninstall-check")
			if err != nil {
				return err
			}
			return uninstallCheck(ctx, strata, cmd.String("namespace"), os.Stdout)
		},
	}
}

// maxNamedVolumes bounds the refusal's list: a cluster may hold thousands.
const maxNamedVolumes = 20

func uninstallCheck(ctx context.Context, strata versioned.Interface, namespace string, out io.Writer) error {
	list, err := strata.StrataV1beta1().Volumes(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing Strata volumes: %w", err)
	}
	if len(list.Items) == 0 {
		_, _ = fmt.Fprintf(out, "no Strata volume in namespace %s: uninstalling may go on\n", namespace)
		return nil
	}
	names := make([]string, 0, len(list.Items))
	for _, v := range list.Items {
		names = append(names, v.Name)
	}
	slices.Sort(names)
	shown := names
	if len(shown) > maxNamedVolumes {
		shown = append(shown[:maxNamedVolumes:maxNamedVolumes], fmt.Sprintf("and %d more", len(names)-maxNamedVolumes))
	}
	return cli.Exit(fmt.Sprintf("refusing to uninstall Strata: %d volume(s) exist in namespace %s: %s. "+
		"Delete the PersistentVolumeClaims using them (or the volumes: kubectl -n %s delete volumes.strata.io --all), "+
		"wait until kubectl -n %s get volumes.strata.io lists none, then uninstall again",
		len(names), namespace, strings.Join(shown, ", "), namespace, namespace), 1)
}
