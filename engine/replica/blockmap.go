package replica

import (
	"math/bits"
	"sync/atomic"
)

// The location map is kept in pages allocated on first use. A flat map cost
// 2 bytes + 1 bit per 4 KiB block whether the volume held data or not —
// 8.5 GiB for a 16 TiB volume — so one Expand over a data connection got
// the instance manager, with every volume of its node, killed for memory
// (issue 24). Paged, an empty volume costs its page tables (16 bytes per
// 128 MiB of volume) and memory follows the blocks the replica's layers
// hold, which its disk bounds.
const (
	pageShift  = 15
	pageBlocks = 1 << pageShift // 128 MiB of volume per page
	pageWords  = pageBlocks / 64
)

func pagesFor(nblocks int64) int64 { return (nblocks + pageBlocks - 1) >> pageShift }

// nextPage is the first block of the page after the one of block b.
func nextPage(b int64) int64 { return (b>>pageShift + 1) << pageShift }

func wordMask(b, e int64) (n int64, mask uint64) {
	s := b & 63
	n = min(64-s, e-b)
	mask = ^uint64(0)
	if n < 64 {
		mask = (1<<uint(n) - 1) << uint(s)
	}
	return n, mask
}

type bitPage [pageWords]uint64

// word loads word j of a page; a missing page reads as zeros.
func (p *bitPage) word(j int64) uint64 {
	if p == nil {
		return 0
	}
	return atomic.LoadUint64(&p[j])
}

// bitmap is one bit per block. Pages are published with atomic pointers
// and words changed with atomic operations, because writers sharing the
// I/O lock set bits (and so allocate pages) concurrently. The page table
// itself changes only under the exclusive lock (grown, clearAll).
type bitmap struct {
	pages []atomic.Pointer[bitPage]
}

func newBitmap(nblocks int64) *bitmap {
	return &bitmap{pages: make([]atomic.Pointer[bitPage], pagesFor(nblocks))}
}

func (m *bitmap) pageOf(b int64) *bitPage { return m.pages[b>>pageShift].Load() }

// pageFor returns the page of block b, allocating it; of two writers
// racing to allocate, both use the one published first.
func (m *bitmap) pageFor(b int64) *bitPage {
	slot := &m.pages[b>>pageShift]
	if p := slot.Load(); p != nil {
		return p
	}
	if p := new(bitPage); slot.CompareAndSwap(nil, p) {
		return p
	}
	return slot.Load()
}

func (m *bitmap) has(b int64) bool {
	return m.pageOf(b).word(b>>6%pageWords)&(1<<uint(b&63)) != 0
}

// runEnd returns the end of the run of bits equal to set starting at b, at
// most limit; it looks at whole words, and skips a missing page at once.
func (m *bitmap) runEnd(b, limit int64, set bool) int64 {
	for b < limit {
		p := m.pageOf(b)
		if p == nil {
			if set {
				break
			}
			b = nextPage(b)
			continue
		}
		w := p.word(b >> 6 % pageWords)
		if !set {
			w = ^w
		}
		s := b & 63
		n := int64(bits.TrailingZeros64(^(w >> uint(s)))) // at most 64-s
		b += n
		if n < 64-s {
			break
		}
	}
	return min(b, limit)
}

// set sets bits [b, e) with atomic OR, skipped when they are already set.
func (m *bitmap) set(b, e int64) {
	for b < e {
		n, mask := wordMask(b, e)
		w := &m.pageFor(b)[b>>6%pageWords]
		if atomic.LoadUint64(w)&mask != mask {
			atomic.OrUint64(w, mask)
		}
		b += n
	}
}

// clear clears bits [b, e); callers hold the exclusive lock or, for the
// import's maps, their own.
func (m *bitmap) clear(b, e int64) {
	for b < e {
		p := m.pageOf(b)
		if p == nil {
			b = min(nextPage(b), e)
			continue
		}
		n, mask := wordMask(b, e)
		atomic.AndUint64(&p[b>>6%pageWords], ^mask)
		b += n
	}
}

// clearAll clears every bit and frees the pages; the caller holds the
// exclusive lock.
func (m *bitmap) clearAll() {
	for i := range m.pages {
		m.pages[i].Store(nil)
	}
}

// grown returns a map of nblocks blocks sharing this one's pages; the
// caller holds the exclusive lock, so no page appears meanwhile.
func (m *bitmap) grown(nblocks int64) *bitmap {
	out := newBitmap(nblocks)
	for i := range m.pages {
		out.pages[i].Store(m.pages[i].Load())
	}
	return out
}

type ownerPage [pageBlocks]uint16

// ownerMap is the slot of the layer under the head that holds each block,
// 0 for none. It changes only under the exclusive I/O lock or opMu (see
// Replica), so plain pointers do.
type ownerMap struct {
	pages []*ownerPage
}

func newOwnerMap(nblocks int64) *ownerMap {
	return &ownerMap{pages: make([]*ownerPage, pagesFor(nblocks))}
}

func (m *ownerMap) get(b int64) uint16 {
	if p := m.pages[b>>pageShift]; p != nil {
		return p[b&(pageBlocks-1)]
	}
	return 0
}

// fill sets blocks [b, e) to v; a 0 over a missing page allocates nothing.
func (m *ownerMap) fill(b, e int64, v uint16) {
	for b < e {
		stop := min(nextPage(b), e)
		p := m.pages[b>>pageShift]
		if p == nil && v != 0 {
			p = new(ownerPage)
			m.pages[b>>pageShift] = p
		}
		if p != nil {
			s := p[b&(pageBlocks-1) : (stop-1)&(pageBlocks-1)+1]
			for i := range s {
				s[i] = v
			}
		}
		b = stop
	}
}

// runEnd returns the end of the run of blocks owned by v from b, at most
// limit.
func (m *ownerMap) runEnd(b, limit int64, v uint16) int64 {
	for b < limit {
		p := m.pages[b>>pageShift]
		if p == nil {
			if v != 0 {
				break
			}
			b = nextPage(b)
			continue
		}
		if p[b&(pageBlocks-1)] != v {
			break
		}
		b++
	}
	return min(b, limit)
}

// lowerRunEnd returns the end of the run from b of blocks that a lower
// layer holds (lower) or that none does (!lower), at most limit.
func (m *ownerMap) lowerRunEnd(b, limit int64, lower bool) int64 {
	for b < limit {
		p := m.pages[b>>pageShift]
		if p == nil {
			if lower {
				break
			}
			b = nextPage(b)
			continue
		}
		if (p[b&(pageBlocks-1)] != 0) != lower {
			break
		}
		b++
	}
	return min(b, limit)
}

// replace gives every block owned by from to to.
func (m *ownerMap) replace(from, to uint16) {
	for _, p := range m.pages {
		if p == nil {
			continue
		}
		for i, v := range p {
			if v == from {
				p[i] = to
			}
		}
	}
}

// grown returns a map of nblocks blocks sharing this one's pages; the
// caller holds opMu, so they do not change meanwhile.
func (m *ownerMap) grown(nblocks int64) *ownerMap {
	out := newOwnerMap(nblocks)
	copy(out.pages, m.pages)
	return out
}
