package pki

import "time"

// Authority is a CA held in memory, for benches and tests that start
// instance managers without managers: they play the managers' part,
// writing each instance manager's TLS directory and calling it with a
// manager identity.
type Authority struct{ State *CAState }

// NewAuthority makes a new CA.
func NewAuthority() (*Authority, error) {
	s, err := NewCAState(time.Now())
	if err != nil {
		return nil, err
	}
	return &Authority{State: s}, nil
}

// loopbackHosts are what the tools' instance managers are dialled at:
// they all run on one machine.
var loopbackHosts = []string{"127.0.0.1", "::1", "localhost"}

// Issue signs an identity for the loopback addresses.
func (a *Authority) Issue(id Identity) (*IssuedCert, error) {
	return IssueIdentity(a.State.Current, id, loopbackHosts, time.Now())
}

// WriteDir writes a TLS directory for id (an instance manager's --tls-dir,
// or a tool's).
func (a *Authority) WriteDir(dir string, id Identity) error {
	c, err := a.Issue(id)
	if err != nil {
		return err
	}
	return WriteDir(dir, c, a.State.Bundle)
}

// Source is an in-memory identity.
func (a *Authority) Source(id Identity) (*MemorySource, error) {
	c, err := a.Issue(id)
	if err != nil {
		return nil, err
	}
	var m MemorySource
	m.Set(c, a.State.Bundle)
	return &m, nil
}
