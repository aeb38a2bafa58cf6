// Package vqpn owns the virtual QP number space: the 24-bit vQPNs that name
// logical connections (vconns) multiplexed over a few real QPs, their 8-bit
// generations, the encoding of both into imm_data and wr_id, and the
// connection table that demultiplexes completions back to a vconn with one
// array lookup.
//
// # Layout
//
// An ID is a vQPN and a generation in 32 bits, vQPN high:
//
//	ID:     | 31 ........ 8 | 7 ... 0 |
//	        |  vQPN (24)    | gen (8) |
//
//	imm_data (32 bits) = ID
//	wr_id    (64 bits) = ID<<32 | slot
//
// The same 32-bit ID is used in imm_data and in the high half of wr_id, so a
// receive completion (identified by its imm_data) and a send completion
// (identified by its wr_id) decode with the same code. imm_data is in host
// order here; the verbs provider writes it big-endian, so on the wire the
// three vQPN bytes come first and the generation last. The low 32 bits of
// wr_id, the slot, belong to the caller: the buffer or request that the
// completion frees.
//
// vQPN 0 is never allocated and generation 0 is never issued, so a zeroed
// imm_data or wr_id, or any wr_id whose high half is zero, never matches a
// live vconn.
//
// # Generations and reuse
//
// Each allocation of a vQPN gives it the next generation, 1, 2, ..., 255,
// then 1 again (0 skipped): a vQPN has 255 distinct IDs. A stale ID (one
// whose vconn was released) is rejected by Lookup until its vQPN has been
// allocated again exactly 255·k times; only then could a completion still in
// flight for the old vconn alias the new one. Two guards keep that out of
// reach:
//
//   - Released vQPNs are reused first-in first-out, and while the table can
//     still grow (its high-water mark is below its capacity) a free vQPN is
//     reused only if at least MinReuseDistance vQPNs are free; otherwise a
//     never-used vQPN is taken. So between the release of a vQPN and its
//     reuse at least MinReuseDistance-1 other vQPNs are released, and an
//     alias needs 255·(MinReuseDistance-1) ≈ 260,000 releases while one
//     completion is in flight. Once the table has grown to its capacity the
//     distance is the number of free vQPNs, so a table run nearly full
//     shortens it: size capacity with headroom.
//   - Lookup checks a 31-bit per-slot version (bumped on every Alloc and
//     Release) around its read of the value, so a Lookup that races a
//     Release and a new Alloc of the same vQPN returns the old owner or
//     nothing, never the new one (short of 2^30 reuses of that one vQPN
//     between two of Lookup's loads).
//
// # Concurrency contracts
//
// Lookup, Stale, Len and Cap may be called from any goroutine at any time,
// concurrently with everything, including growth of the table. Lookup is
// wait-free (atomic loads, plus one atomic add when it fails) and allocates
// nothing: it is the completion path.
//
// Alloc and Release may be called from any goroutine; they serialize on one
// mutex. They are the connect and close paths, not the data path. An ID is
// released once, by its owner; a second Release, or a Release of an ID that
// is not live, returns ErrStale.
//
// A Lookup that began before a Release may still return the old value (the
// Release had not happened yet in its order), so an owner must tolerate a
// completion that arrives while it is closing. Once Release has returned,
// every Lookup that starts afterwards fails for that ID and is counted by
// Stale. The table holds the *T, so the value stays valid memory for as long
// as anyone holds it.
//
// # Memory
//
// A slot costs 16 bytes: the value pointer (8) and one state word (8) that
// holds the generation, a live bit, the free-list link and the version.
// Slots are allocated in pages of up to 4096 (64 KiB) as the high-water
// mark grows; a page is never moved or freed, which is what lets Lookup run
// without locks while the table grows. Memory therefore follows the largest
// number of vQPNs ever in use (plus up to MinReuseDistance free ones), not
// the capacity. The page directory costs 8 bytes per 4096 slots of capacity:
// 32 KiB for a table of the full 1<<24-1.
package vqpn
