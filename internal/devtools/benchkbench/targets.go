package benchkbench

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"github.com/sirupsen/logrus"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"

	"github.com/strata-storage/strata/k8s/pkg/apis/strata/v1beta1"
	"github.com/strata-storage/strata/package/images"
	"github.com/strata-storage/strata/types"
)

const (
	benchNamespace = "kbench"
	driverName     = "driver.strata.io"
	podTimeout     = 20 * time.Minute
)

func numCPU() int { return runtime.NumCPU() }

func storageClassName(replicas int) string { return fmt.Sprintf("kbench-%dr", replicas) }

// setUp makes the namespace and a StorageClass per replica count.
func (b *bench) setUp(ctx context.Context) error {
	_, err := b.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNamespace}},
		metav1.CreateOptions{})
	if err != nil {
		return err
	}
	bind := storagev1.VolumeBindingImmediate
	for _, r := range []int{1, 3} {
		sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: storageClassName(r)}, Provisioner: driverName,
			Parameters:        map[string]string{"numberOfReplicas": fmt.Sprint(r), "dataLocality": b.cfg.dataLocality},
			VolumeBindingMode: &bind}
		if _, err := b.kube.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// claimSize is twice fio's span: ext4's own metadata fits beside the file.
func (b *bench) claimSize() (resource.Quantity, error) {
	q, err := resource.ParseQuantity(b.cfg.fileSize + "i")
	if err != nil {
		return q, fmt.Errorf("-size %q: want a size such as 512M", b.cfg.fileSize)
	}
	q.Add(q)
	return q, nil
}

// localPath runs fio in a Pod on a hostPath directory beside the node's
// Strata disk: the same filesystem, without Strata.
func (b *bench) localPath(ctx context.Context) (figures, error) {
	n, err := b.strata.StrataV1beta1().Nodes(types.DefaultNamespace).Get(ctx, b.node, metav1.GetOptions{})
	if err != nil {
		return figures{}, err
	}
	var disk string
	for _, d := range n.Spec.Disks {
		disk = d.Path
		break
	}
	if disk == "" {
		return figures{}, fmt.Errorf("node %s has no disk", b.node)
	}
	dirType := corev1.HostPathDirectoryOrCreate
	vol := corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: filepath.Join(filepath.Dir(disk), "kbench-local"), Type: &dirType}}}
	return b.fioPod(ctx, "local-path", vol, false)
}

// claim runs fio in a Pod on a new Strata claim, then deletes both.
func (b *bench) claim(ctx context.Context, replicas int, block bool) (figures, error) {
	name, vol, done, err := b.newClaim(ctx, replicas, block)
	if err != nil {
		return figures{}, err
	}
	defer done()
	_, stop, err := b.holdClaim(ctx, name, vol, block, replicas)
	if err != nil {
		return figures{}, err
	}
	defer stop()
	return b.fioPod(ctx, name, vol, block)
}

// mountData gives c vol as the device /dev/kbench (block) or at /data.
func mountData(c *corev1.Container, vol corev1.Volume, block bool) {
	if block {
		c.VolumeDevices = []corev1.VolumeDevice{{Name: vol.Name, DevicePath: "/dev/kbench"}}
	} else {
		c.VolumeMounts = []corev1.VolumeMount{{Name: vol.Name, MountPath: "/data"}}
	}
}

// holdClaim attaches the claim to b.node with a Pod that only holds it,
// and waits until it runs and the claim's data is local (waitLocal): the
// fio Pod then shares the attachment (ReadWriteOnce is per node).
func (b *bench) holdClaim(ctx context.Context, claim string, vol corev1.Volume, block bool, replicas int) (*corev1.Pod, func(), error) {
	c := corev1.Container{Name: "hold", Image: images.WorkloadRef, ImagePullPolicy: corev1.PullNever, Command: []string{"sleep", "3600"}}
	mountData(&c, vol, block)
	pod, stop, err := b.startPod(ctx, "hold-"+claim, c, vol)
	if err != nil {
		return nil, nil, err
	}
	err = wait.PollUntilContextTimeout(ctx, time.Second, podTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := b.kube.CoreV1().Pods(benchNamespace).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		return p.Status.Phase == corev1.PodRunning, nil
	})
	var pvc *corev1.PersistentVolumeClaim
	if err == nil {
		pvc, err = b.kube.CoreV1().PersistentVolumeClaims(benchNamespace).Get(ctx, claim, metav1.GetOptions{})
	}
	if err == nil {
		err = b.waitLocal(ctx, pvc.Spec.VolumeName, replicas)
	}
	if err != nil {
		stop()
		return nil, nil, fmt.Errorf("pod %s: %w", pod.Name, err)
	}
	return pod, stop, nil
}

// waitLocal waits, under dataLocality best-effort, until volume has its
// replicas and one of them holds the data on b.node, where fio runs: the
// move starts when the volume is attached, and fio would otherwise measure
// the rebuild or the hop to another node.
func (b *bench) waitLocal(ctx context.Context, volume string, replicas int) error {
	if b.cfg.dataLocality != string(v1beta1.DataLocalityBestEffort) {
		return nil
	}
	start := time.Now()
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		reps, err := b.strata.StrataV1beta1().Replicas(types.DefaultNamespace).List(ctx, metav1.ListOptions{
			LabelSelector: types.LabelVolume + "=" + volume})
		if err != nil {
			return false, err
		}
		local := false
		for _, r := range reps.Items {
			if r.DeletionTimestamp != nil || r.Spec.HealthyAt == "" {
				return false, nil
			}
			local = local || r.Spec.NodeID == b.node
		}
		return local && len(reps.Items) == replicas, nil
	})
	if err != nil {
		return fmt.Errorf("volume %s: no replica on %s: %w", volume, b.node, err)
	}
	b.log.WithFields(logrus.Fields{"volume": volume, "took": time.Since(start).Round(time.Millisecond)}).Info("A replica is on the Pod's node")
	return nil
}

// ext4FromHost runs fio on the host, on the mount of a new ext4 claim that
// a Pod holds: the same node path as "ext4, N replicas" without the Pod's
// cgroup and mount namespace, so the two columns show what the Pod costs.
func (b *bench) ext4FromHost(ctx context.Context, replicas int) (figures, error) {
	name, vol, done, err := b.newClaim(ctx, replicas, false)
	if err != nil {
		return figures{}, err
	}
	defer done()
	pod, stop, err := b.holdClaim(ctx, name, vol, false, replicas)
	if err != nil {
		return figures{}, err
	}
	defer stop()
	claim, err := b.kube.CoreV1().PersistentVolumeClaims(benchNamespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return figures{}, err
	}
	var kubeletRoot string
	for _, n := range b.cluster.Nodes() {
		if n.Name == b.node {
			kubeletRoot = n.KubeletRoot()
		}
	}
	mount := filepath.Join(kubeletRoot, "pods", string(pod.UID), "volumes",
		"kubernetes.io~csi", claim.Spec.VolumeName, "mount")
	return b.hostFio(ctx, []string{"--ioengine=libaio", "--filename=" + filepath.Join(mount, "fio.dat")}, mount)
}

// hostFio runs the suite's jobs on target with the host's fio; what names
// the target in errors.
func (b *bench) hostFio(ctx context.Context, target []string, what string) (figures, error) {
	out, err := exec.CommandContext(ctx, "fio", fioArgs(target, b.cfg.fileSize, b.cfg.runtime)...).CombinedOutput()
	if err != nil {
		return figures{}, fmt.Errorf("fio on %s: %w: %s", what, err, truncate(out, 2000))
	}
	return parseFio(out)
}

// newClaim makes a Strata claim of the suite's size and returns its name,
// a Pod volume for it, and a func that deletes it and waits until it is gone.
func (b *bench) newClaim(ctx context.Context, replicas int, block bool) (string, corev1.Volume, func(), error) {
	size, err := b.claimSize()
	if err != nil {
		return "", corev1.Volume{}, nil, err
	}
	mode, kind := corev1.PersistentVolumeFilesystem, "fs"
	if block {
		mode, kind = corev1.PersistentVolumeBlock, "block"
	}
	name := fmt.Sprintf("strata-%dr-%s", replicas, kind)
	sc := storageClassName(replicas)
	pvc := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeMode: &mode,
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}}}}
	claims := b.kube.CoreV1().PersistentVolumeClaims(benchNamespace)
	if _, err := claims.Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
		return "", corev1.Volume{}, nil, err
	}
	done := func() {
		_ = claims.Delete(context.Background(), name, metav1.DeleteOptions{})
		b.waitGone(func(ctx context.Context) error { _, err := claims.Get(ctx, name, metav1.GetOptions{}); return err })
	}
	vol := corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}
	return name, vol, done, nil
}

// startPod creates a Pod of container c with vol on b.node, and returns
// it with a func that deletes it and waits until it is gone.
func (b *bench) startPod(ctx context.Context, name string, c corev1.Container, vol corev1.Volume) (*corev1.Pod, func(), error) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: benchNamespace},
		Spec: corev1.PodSpec{NodeName: b.node, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{c}, Volumes: []corev1.Volume{vol}}}
	pods := b.kube.CoreV1().Pods(benchNamespace)
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return nil, nil, err
	}
	stop := func() {
		_ = pods.Delete(context.Background(), pod.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		b.waitGone(func(ctx context.Context) error { _, err := pods.Get(ctx, pod.Name, metav1.GetOptions{}); return err })
	}
	return pod, stop, nil
}

// fioPod runs fio in a Pod on b.node with vol mounted at /data (or, for
// block, as the device /dev/kbench) and parses its output.
func (b *bench) fioPod(ctx context.Context, name string, vol corev1.Volume, block bool) (figures, error) {
	target := []string{"--ioengine=libaio", "--filename=/data/fio.dat"}
	if block {
		target[1] = "--filename=/dev/kbench"
	}
	c := b.fioContainer(target)
	mountData(&c, vol, block)
	return b.runFioPod(ctx, name, c, vol)
}

// fioContainer runs the suite's jobs on target (fio's engine options).
func (b *bench) fioContainer(target []string) corev1.Container {
	c := corev1.Container{Name: "fio", Image: images.FioRef, ImagePullPolicy: corev1.PullNever, Command: []string{"fio"},
		Args: fioArgs(target, b.cfg.fileSize, b.cfg.runtime)}
	if b.cfg.fioCPU != "" {
		c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(b.cfg.fioCPU)}
	}
	return c
}

// runFioPod runs c (a fioContainer) in a Pod on b.node with vol, waits
// for it to end and parses its output.
func (b *bench) runFioPod(ctx context.Context, name string, c corev1.Container, vol corev1.Volume) (figures, error) {
	pod, stop, err := b.startPod(ctx, "fio-"+name, c, vol)
	if err != nil {
		return figures{}, err
	}
	defer stop()
	pods := b.kube.CoreV1().Pods(benchNamespace)
	var phase corev1.PodPhase
	err = wait.PollUntilContextTimeout(ctx, time.Second, podTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, nil
	})
	logs, lerr := pods.GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil || phase != corev1.PodSucceeded {
		return figures{}, fmt.Errorf("pod %s: %v (phase %s), logs: %s, %v", pod.Name, err, phase, truncate(logs, 2000), lerr)
	}
	if lerr != nil {
		return figures{}, fmt.Errorf("pod %s's logs: %w", pod.Name, lerr)
	}
	return parseFio(logs)
}

// rawNBD attaches a new volume to b.node through a strata-api ticket and
// runs fio's nbd engine against its export in a Pod on that node, as the
// other targets' fio runs: the same image, the same cgroup class, so the
// ratios compare the paths and not where fio ran. The export is a unix
// socket on the node; the Pod mounts its directory at the same path.
// fromHost runs fio on the host instead, as the suite did before: fio's
// nbd engine is a client in fio's own process, so where it runs weighs on
// this target more than on the others, whose I/O the kernel carries.
func (b *bench) rawNBD(ctx context.Context, replicas int, fromHost bool) (figures, error) {
	size, err := b.claimSize()
	if err != nil {
		return figures{}, err
	}
	name := fmt.Sprintf("kbench-raw-%dr", replicas)
	if fromHost {
		name += "-host"
	}
	volumes := b.strata.StrataV1beta1().Volumes(types.DefaultNamespace)
	v := &v1beta1.Volume{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: types.DefaultNamespace},
		Spec: v1beta1.VolumeSpec{Size: size, NumberOfReplicas: int32(replicas), Frontend: v1beta1.VolumeFrontendNBD,
			DataLocality: v1beta1.DataLocality(b.cfg.dataLocality)}}
	if _, err := volumes.Create(ctx, v, metav1.CreateOptions{}); err != nil {
		return figures{}, err
	}
	defer func() {
		_ = b.editTickets(context.Background(), name, func(m map[string]*v1beta1.AttachmentTicket) { delete(m, "kbench") })
		_ = wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, time.Minute, true,
			func(ctx context.Context) (bool, error) {
				v, err := volumes.Get(ctx, name, metav1.GetOptions{})
				return err == nil && v.Status.State == v1beta1.VolumeStateDetached, nil
			})
		_ = volumes.Delete(context.Background(), name, metav1.DeleteOptions{})
	}()
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := b.editTickets(ctx, name, func(m map[string]*v1beta1.AttachmentTicket) {
			m["kbench"] = &v1beta1.AttachmentTicket{ID: "kbench", Type: v1beta1.AttacherTypeStrataAPI, NodeID: b.node,
				Parameters: map[string]string{}}
		})
		return err == nil, nil // the VolumeAttachment may not exist yet
	})
	if err != nil {
		return figures{}, fmt.Errorf("attaching %s: %w", name, err)
	}
	var endpoint string
	err = wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		v, err := volumes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		endpoint = v.Status.FrontendEndpoint
		return v.Status.State == v1beta1.VolumeStateAttached && endpoint != "", nil
	})
	if err != nil {
		return figures{}, fmt.Errorf("%s has no frontend endpoint: %w", name, err)
	}
	if err := b.waitLocal(ctx, name, replicas); err != nil {
		return figures{}, err
	}
	target := []string{"--ioengine=nbd", "--uri=" + endpoint}
	if fromHost {
		return b.hostFio(ctx, target, endpoint)
	}
	sock, err := nbdSocket(endpoint)
	if err != nil {
		return figures{}, err
	}
	dirType := corev1.HostPathDirectory
	vol := corev1.Volume{Name: "nbd", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
		Path: filepath.Dir(sock), Type: &dirType}}}
	c := b.fioContainer(target)
	c.VolumeMounts = []corev1.VolumeMount{{Name: vol.Name, MountPath: filepath.Dir(sock)}}
	return b.runFioPod(ctx, name, c, vol)
}

// nbdSocket is the socket path of an nbd+unix URI (the instance manager's
// form, nbd+unix:///<volume>?socket=<path>).
func nbdSocket(endpoint string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", fmt.Errorf("frontend endpoint %q: %w", endpoint, err)
	}
	sock := u.Query().Get("socket")
	if u.Scheme != "nbd+unix" || !filepath.IsAbs(sock) {
		return "", fmt.Errorf("frontend endpoint %q: want nbd+unix:///<export>?socket=<absolute path>", endpoint)
	}
	return sock, nil
}

func (b *bench) editTickets(ctx context.Context, volume string, edit func(map[string]*v1beta1.AttachmentTicket)) error {
	vas := b.strata.StrataV1beta1().VolumeAttachments(types.DefaultNamespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		va, err := vas.Get(ctx, volume, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if va.Spec.AttachmentTickets == nil {
			va.Spec.AttachmentTickets = map[string]*v1beta1.AttachmentTicket{}
		}
		edit(va.Spec.AttachmentTickets)
		_, err = vas.Update(ctx, va, metav1.UpdateOptions{})
		return err
	})
}

// waitGone waits (a minute at most) until get says not found.
func (b *bench) waitGone(get func(context.Context) error) {
	err := wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, 2*time.Minute, true,
		func(ctx context.Context) (bool, error) { return apierrors.IsNotFound(get(ctx)), nil })
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		b.log.WithError(err).Warn("Waiting for a bench object to go")
	}
}
