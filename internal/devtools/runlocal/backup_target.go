package runlocal

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/strata-storage/strata/controller/backup"
	"github.com/strata-storage/strata/internal/backupstore"
	"github.com/strata-storage/strata/internal/devtools/localcluster"
	"github.com/strata-storage/strata/internal/devtools/s3server"
	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
	"github.com/strata-storage/strata/types"
)

// backupBucket is the local S3 server's bucket the default target uses.
const backupBucket = "backups"

// StartBackupTarget runs the local S3 server (versitygw, built and cached
// by scripts/build-tools.sh) with its data under runDir/s3, and points the
// BackupTarget named default at it through a credential Secret, as an
// admin would on a real cluster.
func StartBackupTarget(ctx context.Context, log logrus.FieldLogger, cluster *localcluster.Cluster, root, runDir string) (*s3server.Server, error) {
	bin, err := s3server.Binary(ctx, root)
	if err != nil {
		return nil, err
	}
	srv, err := s3server.Start(bin, filepath.Join(runDir, "s3"))
	if err != nil {
		return nil, err
	}
	if err := defaultBackupTarget(ctx, cluster, srv); err != nil {
		_ = srv.Stop()
		return nil, err
	}
	log.WithFields(logrus.Fields{"endpoint": srv.Endpoint, "bucket": backupBucket, "data": srv.Dir}).
		Info("local S3 server started; BackupTarget default points at it")
	return srv, nil
}

func defaultBackupTarget(ctx context.Context, cluster *localcluster.Cluster, srv *s3server.Server) error {
	store, err := backupstore.NewS3Store(backupstore.S3Config{Endpoint: srv.Endpoint, Bucket: backupBucket,
		Region: "us-east-1", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey})
	if err != nil {
		return err
	}
	if err := store.MakeBucket(ctx); err != nil {
		return fmt.Errorf("creating bucket %s on the local S3 server: %w", backupBucket, err)
	}
	kube, err := kubernetes.NewForConfig(cluster.AdminConfig)
	if err != nil {
		return err
	}
	strata, err := versioned.NewForConfig(cluster.AdminConfig)
	if err != nil {
		return err
	}
	// The one credential Secret name the shipped Role lets the managers read.
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: types.BackupCredentialsSecret, Namespace: systemNamespace},
		StringData: map[string]string{backupstore.SecretEndpoint: srv.Endpoint,
			backupstore.SecretAccessKey: srv.AccessKey, backupstore.SecretSecretKey: srv.SecretKey}}
	if _, err := kube.CoreV1().Secrets(systemNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating the backup target's Secret: %w", err)
	}
	bt := &v1beta1.BackupTarget{ObjectMeta: metav1.ObjectMeta{Name: backup.DefaultBackupTargetName, Namespace: systemNamespace},
		Spec: v1beta1.BackupTargetSpec{BackupTargetURL: "s3://" + backupBucket + "@us-east-1/strata",
			CredentialSecret: secret.Name, PollInterval: metav1.Duration{Duration: defaultPollInterval}}}
	if _, err := strata.StrataV1beta1().BackupTargets(systemNamespace).Create(ctx, bt, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating BackupTarget %s: %w", bt.Name, err)
	}
	return nil
}
