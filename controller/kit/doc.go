// Package kit is what every controller family shares: the base controller
// (rate-limited queues and the sample-controller worker loop), typed
// informer event handlers, owner-node responsibility, job retries, the
// instance cache fed by the instance managers' Watch streams, conditions,
// attachment tickets, and the facts about CRs that several families read
// (an engine running, a backup finished, a backing image's verdict).
package kit
