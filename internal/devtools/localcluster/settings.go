package localcluster

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

// LocalSettings differ from the defaults for a cluster whose disks are
// directories on the developer's own filesystem: keeping 25% of that
// filesystem free for Strata says nothing about Strata, and a busy disk
// would refuse every replica. Its image servers listen on loopback like
// everything else here (test/e2e's startImageServer and
// startStallingServer, test/deployed's serveDir, a developer's: all on
// 127.0.0.1, as the managers share the host's network), which downloads
// may not reach by default: loopback alone is allowed, not the private
// ranges, the nodes' addresses or the Pod and Service ranges, so the
// suites meet the refusals a real cluster has. make run, the end-to-end
// suite and bench-scale all apply them.
var LocalSettings = map[types.SettingName]string{
	types.SettingStorageMinimalAvailablePercentage:   "1",
	types.SettingBackingImageDownloadAllowedNetworks: "127.0.0.0/8",
}

// ApplyLocalSettings writes LocalSettings into the Setting CRs of namespace
// (the managers create them at start, so call it once they run).
func (c *Cluster) ApplyLocalSettings(ctx context.Context, namespace string) error {
	settings := versioned.NewForConfigOrDie(c.AdminConfig).StrataV1beta1().Settings(namespace)
	for name, value := range LocalSettings {
		err := retry.OnError(retry.DefaultBackoff, func(error) bool { return ctx.Err() == nil }, func() error {
			s, err := settings.Get(ctx, string(name), metav1.GetOptions{})
			if err != nil {
				return err
			}
			if s.Value == value {
				return nil
			}
			s.Value = value
			_, err = settings.Update(ctx, s, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("setting %s to %q: %w", name, value, err)
		}
		c.log.WithField("setting", name).WithField("value", value).Info("local setting applied (a cluster on one machine: disks are directories, image servers on loopback)")
	}
	return nil
}
