package engine

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/transport"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestCloseWrite: a half-close. A sends, then closes its sending side; B
// reads every message, then EOF, and answers after it; A reads the answer
// whole, while its own sends fail. Then B closes: A reads EOF, closes, and
// both vconns are released. Either side may close first.
func TestCloseWrite(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.Auto} {
		for _, aFirst := range []bool{true, false} {
			name := tr.String() + "/A-closes-first"
			if !aFirst {
				name = tr.String() + "/B-closes-first"
			}
			t.Run(name, func(t *testing.T) {
				ctx, a, b, va, vb := testPair(t, softwire.Faults{}, tr, 20*time.Second)
				const n, m = 300, 200
				size := func(i int) int { return 1 + (i*7919)%40000 }
				sent := make(chan error, 1)
				go func() {
					// A's messages exceed B's credits: B reads meanwhile.
					sendNumbered(ctx, t, va, n, size)
					if err := va.CloseWrite(); err != nil {
						sent <- err
						return
					}
					if err := va.Send(ctx, []byte("late")); !errors.Is(err, ErrClosed) {
						sent <- fmt.Errorf("send after CloseWrite: %v, want ErrClosed", err)
						return
					}
					sent <- nil
				}()
				recvNumbered(ctx, t, vb, n, size)
				if err := <-sent; err != nil {
					t.Fatal(err)
				}
				if _, err := vb.Recv(ctx); !errors.Is(err, io.EOF) {
					t.Fatalf("B's receive after A's CloseWrite: %v, want EOF", err)
				}
				// B answers after the EOF, as a server answers a request
				// its client ended with shutdown(SHUT_WR).
				go sendNumbered(ctx, t, vb, m, size)
				recvNumbered(ctx, t, va, m, size)
				if aFirst {
					// A closes while B has not: A's vconn waits for B's FIN.
					if err := va.Close(); err != nil {
						t.Fatal(err)
					}
					if err := vb.Close(); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := vb.Close(); err != nil {
						t.Fatal(err)
					}
					if _, err := va.Recv(ctx); !errors.Is(err, io.EOF) {
						t.Fatalf("A's receive after B's close: %v, want EOF", err)
					}
					if err := va.Close(); err != nil {
						t.Fatal(err)
					}
				}
				waitFor(t, func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 }, "vconns released")
			})
		}
	}
}
