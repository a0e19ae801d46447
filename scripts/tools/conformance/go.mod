// Tools module for Kubernetes' own storage e2e suite, run against Strata by
// test/conformance (make test-conformance): the e2e test binary of
// k8s.io/kubernetes v1.36.3 (`go test -c k8s.io/kubernetes/test/e2e`,
// whose External Storage tests read a testdriver file) and the ginkgo CLI
// at the version the suite is written against, which runs that binary on
// several parallel nodes. scripts/build-tools.sh builds both from here.
//
// A module of its own, apart from scripts/tools/cluster: the cache of every
// other tool is keyed by that module's go.mod and go.sum, so adding the
// e2e suite's dependencies (cloud provider SDKs and more) there would
// rebuild the control plane, the sidecars, helm and versitygw; here it
// has a cache key of its own.
//
// The Kubernetes staging modules are replaced with their v0.36.3 releases,
// as in scripts/tools/cluster (k8s.io/kubernetes pins them to v0.0.0 and
// ./staging paths, which a module download does not have).
//
// Nothing in it is imported by Strata's code.
module github.com/strata-storage/strata/scripts/tools/conformance

go 1.26.0

require (
	github.com/onsi/ginkgo/v2 v2.28.1
	k8s.io/kubernetes v1.36.3
)

replace (
	k8s.io/api => k8s.io/api v0.36.3
	k8s.io/apiextensions-apiserver => k8s.io/apiextensions-apiserver v0.36.3
	k8s.io/apimachinery => k8s.io/apimachinery v0.36.3
	k8s.io/apiserver => k8s.io/apiserver v0.36.3
	k8s.io/cli-runtime => k8s.io/cli-runtime v0.36.3
	k8s.io/client-go => k8s.io/client-go v0.36.3
	k8s.io/cloud-provider => k8s.io/cloud-provider v0.36.3
	k8s.io/cluster-bootstrap => k8s.io/cluster-bootstrap v0.36.3
	k8s.io/code-generator => k8s.io/code-generator v0.36.3
	k8s.io/component-base => k8s.io/component-base v0.36.3
	k8s.io/component-helpers => k8s.io/component-helpers v0.36.3
	k8s.io/controller-manager => k8s.io/controller-manager v0.36.3
	k8s.io/cri-api => k8s.io/cri-api v0.36.3
	k8s.io/cri-client => k8s.io/cri-client v0.36.3
	k8s.io/cri-streaming => k8s.io/cri-streaming v0.36.3
	k8s.io/csi-translation-lib => k8s.io/csi-translation-lib v0.36.3
	k8s.io/dynamic-resource-allocation => k8s.io/dynamic-resource-allocation v0.36.3
	k8s.io/endpointslice => k8s.io/endpointslice v0.36.3
	k8s.io/externaljwt => k8s.io/externaljwt v0.36.3
	k8s.io/kms => k8s.io/kms v0.36.3
	k8s.io/kube-aggregator => k8s.io/kube-aggregator v0.36.3
	k8s.io/kube-controller-manager => k8s.io/kube-controller-manager v0.36.3
	k8s.io/kube-proxy => k8s.io/kube-proxy v0.36.3
	k8s.io/kube-scheduler => k8s.io/kube-scheduler v0.36.3
	k8s.io/kubectl => k8s.io/kubectl v0.36.3
	k8s.io/kubelet => k8s.io/kubelet v0.36.3
	k8s.io/metrics => k8s.io/metrics v0.36.3
	k8s.io/mount-utils => k8s.io/mount-utils v0.36.3
	k8s.io/pod-security-admission => k8s.io/pod-security-admission v0.36.3
	k8s.io/sample-apiserver => k8s.io/sample-apiserver v0.36.3
	k8s.io/sample-cli-plugin => k8s.io/sample-cli-plugin v0.36.3
	k8s.io/sample-controller => k8s.io/sample-controller v0.36.3
	k8s.io/streaming => k8s.io/streaming v0.36.3
)
