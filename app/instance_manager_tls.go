package app

import (
	"github.com/urfave/cli/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/strata-storage/strata/engine/imserver"
	"github.com/strata-storage/strata/internal/pki"
)

// instanceManagerTLSFlags are the instance manager's certificate flags.
func instanceManagerTLSFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "tls-dir", Required: true,
			Usage: "directory with this instance manager's certificate (" + pki.IdentityFile + ") and the CA bundle (" +
				pki.BundleFile + "), written by the node's manager (its --instance-manager-tls-dir) and re-read when they " +
				"change. gRPC accepts only managers' certificates, data connections only instance managers'; until the " +
				"files exist every connection is refused"},
		&cli.BoolFlag{Name: "data-encryption", Value: true,
			Usage: "encrypt replica data connections; false still authenticates both ends with mutual TLS but carries the " +
				"data in the clear (for a private storage network, when encryption costs too much throughput: docs/security.md)"},
	}
}

// withInstanceManagerTLS fills opts' data-connection TLS from the flags and
// returns the gRPC server's credentials.
func withInstanceManagerTLS(cmd *cli.Command, opts *imserver.Options) grpc.ServerOption {
	opts.TLSDir = cmd.String("tls-dir")
	src := pki.NewDirSource(opts.TLSDir)
	opts.DataServerTLS = pki.ServerConfig(src, pki.ComponentInstanceManager)
	opts.DataClientTLS = pki.ClientConfig(src, pki.ComponentInstanceManager)
	opts.DataUnencrypted = !cmd.Bool("data-encryption")
	return grpc.Creds(credentials.NewTLS(pki.ServerConfig(src, pki.ComponentManager)))
}
