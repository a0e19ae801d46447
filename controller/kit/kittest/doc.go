// Package kittest is test support that needs the kit: a real instance
// manager in the test's process, reached over gRPC, with an instance cache
// fed by its Watch stream as the InstanceManager controller feeds it.
package kittest
