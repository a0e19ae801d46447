package imagefile

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strings"
	"sync"
)

// fakeDNS answers A queries for one name with a list of addresses, the
// first query with the first, and so on (the last one after that); other
// names do not exist and AAAA queries have no answer. It serves Go's own
// resolver over in-memory pipes (TCP framing), so no socket or
// /etc/resolv.conf takes part.
type fakeDNS struct {
	name    string // fully qualified, lower case: "img.test."
	answers []netip.Addr

	mu       sync.Mutex
	aQueries int
}

// resolver is a net.Resolver that asks only d.
func (d *fakeDNS) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		go d.serve(server)
		return client, nil
	}}
}

// queries is how many A queries for the name were answered.
func (d *fakeDNS) queries() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.aQueries
}

func (d *fakeDNS) serve(conn net.Conn) {
	defer conn.Close()
	for {
		var size [2]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return
		}
		query := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(conn, query); err != nil {
			return
		}
		reply := d.answer(query)
		if reply == nil {
			return
		}
		if _, err := conn.Write(binary.BigEndian.AppendUint16(nil, uint16(len(reply)))); err != nil {
			return
		}
		if _, err := conn.Write(reply); err != nil {
			return
		}
	}
}

// answer builds the reply to one query (RFC 1035 4.1): the header with
// the query's ID, the question, and an A record when there is one.
func (d *fakeDNS) answer(query []byte) []byte {
	if len(query) < 12 {
		return nil
	}
	var labels []string
	end := 12
	for end < len(query) && query[end] != 0 {
		n := int(query[end])
		if end+1+n > len(query) {
			return nil
		}
		labels = append(labels, string(query[end+1:end+1+n]))
		end += 1 + n
	}
	end += 5 // the root label, QTYPE, QCLASS
	if end > len(query) {
		return nil
	}
	question := query[12:end]
	qtype := binary.BigEndian.Uint16(question[len(question)-4:])
	name := strings.ToLower(strings.Join(labels, ".") + ".")

	const typeA, flags, nameError = 1, 0x8580, 3 // flags: response, authoritative, recursion desired and available
	rcode, answers := uint16(0), 0
	var addr netip.Addr
	switch {
	case name != d.name:
		rcode = nameError
	case qtype == typeA:
		d.mu.Lock()
		addr = d.answers[min(d.aQueries, len(d.answers)-1)]
		d.aQueries++
		d.mu.Unlock()
		answers = 1
	}
	reply := append([]byte{}, query[:2]...) // ID
	reply = binary.BigEndian.AppendUint16(reply, flags|rcode)
	for _, count := range []int{1, answers, 0, 0} { // question, answer, authority, additional
		reply = binary.BigEndian.AppendUint16(reply, uint16(count))
	}
	reply = append(reply, question...)
	if answers == 1 {
		a := addr.As4()
		reply = append(reply, 0xc0, 12) // the name: a pointer to the question's
		reply = binary.BigEndian.AppendUint16(reply, typeA)
		reply = binary.BigEndian.AppendUint16(reply, 1) // class IN
		reply = binary.BigEndian.AppendUint32(reply, 0) // TTL
		reply = binary.BigEndian.AppendUint16(reply, 4)
		reply = append(reply, a[:]...)
	}
	return reply
}
