package localcluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/strata-storage/strata/csi"
	"github.com/strata-storage/strata/k8s/pkg/client/clientset/versioned"
)

// VolumeTraces is where a node would still hold something of one volume
// after it is gone: what the suites check once a claim is deleted.
type VolumeTraces struct {
	Volume string
	// Dirs are the volume's own directories on the node (the node plugin's
	// state of it, and where instance managers serve files, its file's).
	Dirs []string
	// KubeletRoot is the node's kubelet root (its CSI paths are checked).
	KubeletRoot string
	// LoopsBefore are the loop devices attached before the test
	// (LoopDevices): only new ones count.
	LoopsBefore map[string]string
}

// Left lists what is left: a mount under one of Dirs or of the kubelet's
// CSI paths of the volume, a loop device of it that was not there before,
// an nbdfuse process serving one of Dirs.
func (v VolumeTraces) Left() []string {
	var left []string
	for _, dir := range v.Dirs {
		for _, m := range MountsUnder(dir) {
			left = append(left, "mount "+m)
		}
	}
	// The kubelet's paths of this volume: named for the PV (block) or for
	// the SHA-256 of the volume handle (a filesystem's staging).
	sum := sha256.Sum256([]byte(v.Volume))
	handleHash := hex.EncodeToString(sum[:])
	for _, m := range MountsUnder(filepath.Join(v.KubeletRoot, "plugins", "kubernetes.io", "csi")) {
		if strings.Contains(m, v.Volume) || strings.Contains(m, handleHash) {
			left = append(left, "mount "+m)
		}
	}
	for dev, file := range LoopDevices() {
		// Only this volume's: tests running beside make their own (under
		// their own directories, or the kubelet's for a block volume under
		// a path named for the PV, which is named like the volume).
		if !v.owns(file) {
			continue
		}
		if was, found := v.LoopsBefore[dev]; !found || was != file {
			left = append(left, "loop device "+dev+" on "+file)
		}
	}
	for _, dir := range v.Dirs {
		for _, p := range NBDFuseProcesses(dir) {
			left = append(left, "nbdfuse "+p)
		}
	}
	return left
}

func (v VolumeTraces) owns(file string) bool {
	for _, dir := range v.Dirs {
		if strings.HasPrefix(file, dir+"/") {
			return true
		}
	}
	return strings.Contains(file, v.Volume)
}

// NBDFuseProcesses lists the command lines of the nbdfuse processes (the
// node plugins', in process mode or in their containers, seen from the
// host) that mount dir.
func NBDFuseProcesses(dir string) []string {
	var out []string
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != "nbdfuse" {
			continue
		}
		for _, a := range args[1:] {
			if a == dir || a == dir+"/" {
				out = append(out, strings.Join(args, " "))
				break
			}
		}
	}
	return out
}

// VolumesOfClaim lists the Strata volumes in namespace that the CSI driver
// made for the claim claimNamespace/claim (named in their annotations).
func VolumesOfClaim(ctx context.Context, strata versioned.Interface, namespace, claimNamespace, claim string) ([]string, error) {
	list, err := strata.StrataV1beta1().Volumes(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, v := range list.Items {
		if v.Annotations[csi.AnnotationPVCName] == claim && v.Annotations[csi.AnnotationPVCNamespace] == claimNamespace {
			out = append(out, v.Name)
		}
	}
	return out, nil
}
