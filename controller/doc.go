// Package controller is the root of Strata's controllers: each family lives
// in a package of its own under it (volume, attachment, instance, snapshot,
// backup, backingimage, node, quota, setting) on the shared kit; this
// package holds the manager's metrics collector and the tests that drive
// several families together against a real instance manager.
//
// Each controller has a *_controller_base.go (constructor, informer handlers
// that decide whom to enqueue, Run) and a *_controller.go (the sync: one
// function per decision). A family imports the kit, never a sibling: what
// two families share is in the kit, the datastore or the API types.
package controller
