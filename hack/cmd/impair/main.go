// Command impair impairs the packets that iptables sends to an NFQUEUE
// queue: it drops some, holds some back so that they arrive out of order,
// and can delay all. The local cluster (hack/local-cluster/node.sh netem)
// uses it where the kernel has no sch_netem.
//
//	impair --queue N [--loss 5%] [--reorder 5%] [--delay 1ms] [--hold-max 5ms]
//	       [--seed S] [--stats FILE] [--interval 5s]
//
// It binds queue N in its own network namespace. Its counters go to stderr
// every --interval and on SIGTERM or SIGINT, and as JSON to --stats.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// fraction is a probability flag: "5%" or "0.05".
type fraction float64

func (f *fraction) String() string { return strconv.FormatFloat(float64(*f)*100, 'g', -1, 64) + "%" }

func (f *fraction) Set(s string) error {
	v, err := parseFraction(s)
	if err != nil {
		return err
	}
	*f = fraction(v)
	return nil
}

func parseFraction(s string) (float64, error) {
	pct := strings.HasSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil {
		return 0, fmt.Errorf("not a probability: %q", s)
	}
	if pct {
		v /= 100
	}
	if v < 0 || v > 1 {
		return 0, fmt.Errorf("probability %q is not between 0 and 100%%", s)
	}
	return v, nil
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "impair: %v\n", err)
		os.Exit(1)
	}
}

// fileStats is what --stats holds.
type fileStats struct {
	Queue uint16 `json:"queue"`
	stats
	Held int `json:"held"`
}

// delayed is a batch of verdicts due at a time.
type delayed struct {
	due time.Time
	ids []uint32
}

func run() error {
	var (
		loss, reorder fraction
		qnum          = flag.Uint("queue", 0, "the NFQUEUE queue number to bind (required)")
		delay         = flag.Duration("delay", 0, "a fixed delay for every packet accepted")
		holdMax       = flag.Duration("hold-max", 5*time.Millisecond, "how long a held packet waits for a later one to pass it")
		seed          = flag.Uint64("seed", 1, "the random generator's seed")
		statsFile     = flag.String("stats", "", "write the counters as JSON to this file")
		interval      = flag.Duration("interval", 5*time.Second, "how often to print and write the counters")
		maxLen        = flag.Uint("queue-maxlen", 4096, "packets the kernel queues before it accepts the rest unimpaired")
	)
	flag.Var(&loss, "loss", "the probability of dropping a packet (5% or 0.05)")
	flag.Var(&reorder, "reorder", "the probability of holding a packet back so later ones pass it")
	flag.Parse()
	switch {
	case flag.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	case !isSet("queue"):
		return errors.New("--queue is required")
	case *qnum > 65535:
		return fmt.Errorf("--queue %d: queue numbers go up to 65535", *qnum)
	case float64(loss)+float64(reorder) > 1:
		return errors.New("--loss and --reorder add up to more than 100%")
	case *delay < 0 || *holdMax <= 0 || *interval <= 0:
		return errors.New("--delay must be >= 0, --hold-max and --interval > 0")
	}

	q, err := openQueue(uint16(*qnum), uint32(*maxLen))
	if err != nil {
		return err
	}
	defer q.close()
	// Reads time out so the loop sees a signal within a tick.
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(q.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return fmt.Errorf("setting a read timeout: %w", err)
	}

	var (
		mu    sync.Mutex
		sched = &scheduler{pol: newPolicy(*seed, float64(loss), float64(reorder)), holdMax: *holdMax}
		// Delayed verdicts go through one FIFO so they keep their order.
		later = make(chan delayed, 1<<16)
		// closing is set, under mu, once later is closed.
		closing bool
	)
	send := func(ids []uint32, v uint32) {
		for _, id := range ids {
			if err := q.verdict(id, v); err != nil {
				fmt.Fprintf(os.Stderr, "impair: %v\n", err)
			}
		}
	}
	// release accepts ids now or after --delay; mu is held.
	release := func(ids []uint32) {
		if len(ids) == 0 {
			return
		}
		if *delay == 0 {
			send(ids, nfAccept)
			return
		}
		later <- delayed{time.Now().Add(*delay), ids}
	}
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		for d := range later {
			time.Sleep(time.Until(d.due))
			send(d.ids, nfAccept)
		}
	}()
	report := func() {
		mu.Lock()
		fs := fileStats{Queue: q.num, stats: sched.stats, Held: len(sched.held)}
		mu.Unlock()
		fmt.Fprintf(os.Stderr, "impair: queue %d: packets %d dropped %d reordered %d\n", fs.Queue, fs.Packets, fs.Dropped, fs.Reordered)
		if *statsFile != "" {
			if err := writeStats(*statsFile, fs); err != nil {
				fmt.Fprintf(os.Stderr, "impair: %v\n", err)
			}
		}
	}
	fmt.Fprintf(os.Stderr, "impair: queue %d bound: loss %v reorder %v delay %v hold-max %v seed %d\n",
		*qnum, &loss, &reorder, *delay, *holdMax, *seed)
	report()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for {
		select {
		case s := <-sigs:
			mu.Lock()
			// Every packet the tool holds gets its verdict before it goes.
			release(sched.flush())
			closing = true
			close(later)
			mu.Unlock()
			<-senderDone
			fmt.Fprintf(os.Stderr, "impair: %v: exiting\n", s)
			report()
			return nil
		case <-tick.C:
			report()
		default:
		}
		ids, err := q.read()
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) || errors.Is(err, unix.ENOBUFS) {
				continue
			}
			return fmt.Errorf("reading queue %d: %w", *qnum, err)
		}
		mu.Lock()
		for _, id := range ids {
			now := time.Now()
			rel, dropIt := sched.packet(id, now)
			if dropIt {
				send([]uint32{id}, nfDrop)
				continue
			}
			if len(rel) == 0 {
				time.AfterFunc(*holdMax, func() {
					mu.Lock()
					defer mu.Unlock()
					if !closing {
						release(sched.expire(time.Now()))
					}
				})
			}
			release(rel)
		}
		mu.Unlock()
	}
}

// isSet reports whether a flag was given.
func isSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// writeStats replaces path with the counters, whole: a reader never sees
// half a file.
func writeStats(path string, fs fileStats) error {
	b, err := json.Marshal(fs)
	if err != nil {
		return fmt.Errorf("encoding the counters: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".impair-stats-*")
	if err != nil {
		return fmt.Errorf("writing the counters: %w", err)
	}
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the counters: %w", err)
	}
	if err := tmp.Close(); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the counters: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("writing the counters: %w", err)
	}
	return nil
}
