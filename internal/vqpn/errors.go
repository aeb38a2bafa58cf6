package vqpn

import "errors"

// Errors returned by Table, wrapped with context; test with errors.Is.
var (
	// ErrFull is returned by Alloc when every vQPN up to the table's
	// capacity is live.
	ErrFull = errors.New("vqpn: table full")
	// ErrStale is returned by Release for an ID that is not live: already
	// released, of an older generation, never allocated, or out of range.
	ErrStale = errors.New("vqpn: stale or unknown ID")
	// ErrNilValue is returned by Alloc for a nil value: Lookup's ok must
	// mean a value was found.
	ErrNilValue = errors.New("vqpn: nil value")
)
