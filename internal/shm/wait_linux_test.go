package shm

import (
	"bytes"
	"sync"
	"testing"
	"time"
)

// TestPushWaitArmTaken: a release that lands between PushWait's Arm and
// the Push after it takes the arm (and rings) but frees too little room
// for the message waiting; the producer must arm again before it sleeps,
// or no later release rings, and a producer without a timeout (the
// agent's, on the RX ring) sleeps for good with the ring drained (E6's
// stream stalled for five minutes this way). The slab fits 64 + 8000 +
// 8000 bytes; the fourth message, 8000 bytes, needs the first two
// released (it wraps to the slab's start). The hook releases the first
// one only; the test releases the rest once the producer sleeps, and
// PushWait must return.
func TestPushWaitArmTaken(t *testing.T) {
	l := Layout{Entries: 8, Slab: 16384, MaxMessage: 8192}
	agent, pod := pair(t, l)
	defer func() { _ = agent.Close(); _ = pod.Close() }()
	_, prod := agent.Agent()
	_, cons := pod.Pod()
	msg := func(n int, b byte) []byte { return bytes.Repeat([]byte{b}, n) }
	for i, n := range []int{64, 8000, 8000} {
		if ok, err := prod.Push(msg(n, byte(i)), 0, 0); !ok || err != nil {
			t.Fatalf("push %d: %v, %v", i, ok, err)
		}
	}
	var mu sync.Mutex // the consumer's, between the hook and the test
	release := func() {
		mu.Lock()
		defer mu.Unlock()
		if _, _, ok, err := cons.Peek(); !ok || err != nil {
			t.Errorf("peek: %v, %v", ok, err)
			return
		}
		cons.Release()
	}
	var once sync.Once
	armed = func() { once.Do(release) }
	defer func() { armed = nil }()
	done := make(chan error, 1)
	go func() {
		done <- prod.PushWait(msg(8000, 3), 0, 0, func() (time.Duration, error) { return -1, nil })
	}()
	time.Sleep(50 * time.Millisecond) // the producer asleep, or about to be
	select {
	case err := <-done:
		t.Fatalf("PushWait returned (%v) with the ring still too full", err)
	default:
	}
	release()
	release()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		agent.Shutdown() // ends the wait
		<-done
		t.Fatal("PushWait slept on after the ring was drained: the release in its Arm's window took the arm, and no later one rang")
	}
	// The fourth message arrived whole.
	mu.Lock()
	defer mu.Unlock()
	d, b, ok, err := cons.Peek()
	if !ok || err != nil || d.Len != 8000 || b[0] != 3 {
		t.Fatalf("after the wait: %+v %v %v", d, ok, err)
	}
	cons.Release()
}
