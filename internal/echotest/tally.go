package echotest

import (
	"fmt"
	"io"
)

// Tally is what checker runs (examples/echo clients) between two nodes
// came to, from their verdicts: runs, and of their messages, by number,
// how many came back, how many failed with an error the client was told,
// and how many vanished with none, came back twice or out of order, or
// came back damaged. On reliable vconns the last three are 0.
type Tally struct {
	Runs, OK, Failed int
	// Sent and Delivered: messages SendMsg took, and that came back
	// whole and in order.
	Sent, Delivered int64
	// FailedInFlight: sent and not back when their vconn failed with an
	// error; the application knows.
	FailedInFlight int64
	// Vanished: sent and never back, with no error said.
	Vanished int64
	// Misordered: back twice, or after a later message.
	Misordered int64
	// Corrupt: back with other bytes than sent.
	Corrupt int64
}

// Add counts one checker run.
func (t *Tally) Add(v Verdict) {
	t.Runs++
	if v.OK {
		t.OK++
	} else {
		t.Failed++
	}
	t.Sent += v.Sent
	t.Delivered += v.Delivered
	t.FailedInFlight += v.Failed
	t.Vanished += v.Vanished
	t.Misordered += v.Duplicated + v.Reordered
	t.Corrupt += v.Corrupt
}

// Sound reports whether no message vanished, came back misordered or
// came back corrupt.
func (t *Tally) Sound() bool { return t.Vanished == 0 && t.Misordered == 0 && t.Corrupt == 0 }

func (t *Tally) plus(o Tally) {
	t.Runs, t.OK, t.Failed = t.Runs+o.Runs, t.OK+o.OK, t.Failed+o.Failed
	t.Sent, t.Delivered, t.FailedInFlight = t.Sent+o.Sent, t.Delivered+o.Delivered, t.FailedInFlight+o.FailedInFlight
	t.Vanished, t.Misordered, t.Corrupt = t.Vanished+o.Vanished, t.Misordered+o.Misordered, t.Corrupt+o.Corrupt
}

// Row is one line of a soak's table: a pair of nodes, its tally, and how
// the pair's run after the chaos ended.
type Row struct {
	From, To string
	Tally    Tally
	After    string
}

// TableHeader is the first line of WriteTable's table.
const TableHeader = "| from → to | runs | ok | failed with an error | sent | delivered | failed in flight, with an error | vanished without error | duplicated or out of order | corrupt | after the chaos |"

// WriteTable writes rows as a Markdown table, with their sum last.
func WriteTable(w io.Writer, rows []Row) {
	fmt.Fprintln(w, TableHeader)
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	var all Tally
	line := func(name string, t Tally, after string) {
		fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %d | %d | %d | %d | %d | %s |\n", name, t.Runs, t.OK, t.Failed,
			t.Sent, t.Delivered, t.FailedInFlight, t.Vanished, t.Misordered, t.Corrupt, after)
	}
	for _, r := range rows {
		line(r.From+" → "+r.To, r.Tally, r.After)
		all.plus(r.Tally)
	}
	line("**all**", all, "")
}
