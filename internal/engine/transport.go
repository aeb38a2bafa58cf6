package engine

// DefaultAutoThreshold is the largest message the Auto policy sends as a
// datagram; larger ones go over RC. Measured on the soft provider
// (BenchmarkTransport and the e5 suite): one vconn streaming 16 B to 1 KiB
// messages moves about 0.73M msgs/s over Auto's datagrams against 0.63M
// over RC; at 4 KB, RC's chunking is as cheap and a datagram would need the
// whole MTU, so Auto hands larger messages to RC.
const DefaultAutoThreshold = 1024
