// Package format owns the engine's formats: what one engine's messages carry
// to another inside a SEND (the 32-byte message header and the secret that authenticates it, bundles of whole
// messages, the export of a region), what the engine's own work requests
// carry in wr_id (Tag), and the serial-number order in which credits,
// sequence numbers and acknowledgements wrap (Advance).
//
// It is pure: no verbs, no goroutines, no state. Every parser here reads a
// peer's bytes and trusts none of them; each has a fuzz target. The engine
// (package engine) decides what to send and when; this package only says
// how it looks in memory.
//
// Every function here may be called from any goroutine: they touch only
// their arguments. The engine's pollers call the Raw accessors and the Tag
// helpers once per message, so all of them are small enough to inline.
package format
