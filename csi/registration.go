package csi

import (
	"context"
	"path/filepath"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// Registrar tells the kubelet about the node plugin: the kubelet watches
// <root>/plugins_registry/ for sockets, asks each for its info and reports
// back whether it registered the plugin. Upstream ships this as the
// node-driver-registrar sidecar, which the module proxy here does not serve;
// the protocol is two calls, so it is served in process.
type Registrar struct {
	registerapi.UnimplementedRegistrationServer

	csiSocket string // the path the kubelet dials for CSI calls
	log       logrus.FieldLogger
}

// RegistrationSocket is where the kubelet with root dir kubeletRoot looks for
// this driver's registration socket.
func RegistrationSocket(kubeletRoot string) string {
	return filepath.Join(kubeletRoot, "plugins_registry", DriverName+"-reg.sock")
}

// NewRegistrar returns a registrar announcing the CSI socket csiSocket.
func NewRegistrar(csiSocket string, log logrus.FieldLogger) *Registrar {
	return &Registrar{csiSocket: csiSocket, log: log.WithField("component", "csi-registrar")}
}

func (r *Registrar) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              DriverName,
		Endpoint:          r.csiSocket,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *Registrar) NotifyRegistrationStatus(_ context.Context, status *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if status.PluginRegistered {
		r.log.Info("Registered with the kubelet")
	} else {
		r.log.WithField("error", status.Error).Error("The kubelet refused the registration")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// Serve serves the registration socket until ctx ends.
func (r *Registrar) Serve(ctx context.Context, path string) error {
	l, err := listenUnix(path)
	if err != nil {
		return err
	}
	srv := grpc.NewServer()
	registerapi.RegisterRegistrationServer(srv, r)
	r.log.WithField("socket", path).Info("Serving plugin registration")
	return serveUntilDone(ctx, srv, l)
}
