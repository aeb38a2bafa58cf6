package engine

import "github.com/rdmavisor/rdmavisor/internal/engine/format"

// DefaultAutoThreshold is the largest message the Auto policy sends as a
// datagram (it is capped at a chunk, ChunkSize less the header, which is
// what one UC message carries); larger ones go over RC, chunked. Measured
// on the soft provider (the e5 suite; bench/results): one vconn streaming
// messages of 16 B to 4 KiB moved them at 1.05-1.4x the rate over UC as
// over RC, so every message that fits a chunk goes as a datagram.
const DefaultAutoThreshold = DefaultChunkSize - format.HeaderLen
