// Command localdns is the local test cluster's DNS (hack/local-cluster has
// no CoreDNS and no registry to pull one from): it watches Services and
// EndpointSlices and answers A and AAAA queries, over UDP and TCP, for
// SERVICE.NAMESPACE.svc.cluster.local: a headless Service's ready pod IPs,
// a ClusterIP Service's ClusterIPs. Every other name is NXDOMAIN: the
// cluster's nodes reach nothing outside the machine, so there is no
// upstream to forward to. hack/local-cluster/dns.yaml runs it as the
// Service kube-dns at 10.96.0.10, the kubelet's clusterDNS.
//
//	localdns --addr :5353 --domain cluster.local
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("localdns: ")
	addr := flag.String("addr", ":53", "UDP and TCP address to answer on")
	domain := flag.String("domain", "cluster.local", "the cluster's domain (the kubelet's clusterDomain)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *addr, *domain); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context, addr, domain string) error {
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("in-cluster config: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("client: %w", err)
	}
	zone, err := watchZone(ctx, cs, domain)
	if err != nil {
		return err
	}
	// Listening only once the caches are in: a DNS that answered NXDOMAIN
	// for Services it has not read yet would be wrong, not just slow.
	return serve(ctx, addr, domain, zone.Load)
}

// watchZone builds domain's zone from the cluster's Services and
// EndpointSlices, once its caches are in, and rebuilds it as they change
// until ctx ends.
func watchZone(ctx context.Context, cs kubernetes.Interface, domain string) (*atomic.Pointer[Zone], error) {
	var zone atomic.Pointer[Zone]
	zone.Store(BuildZone(domain, nil, nil))
	f := informers.NewSharedInformerFactory(cs, 0)
	svcs, slices := f.Core().V1().Services(), f.Discovery().V1().EndpointSlices()
	// Any change marks the zone stale; one goroutine rebuilds it, so a
	// burst of events costs one rebuild.
	stale := make(chan struct{}, 1)
	mark := func(any) {
		select {
		case stale <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: mark, DeleteFunc: mark, UpdateFunc: func(_, n any) { mark(n) }}
	for _, inf := range []cache.SharedIndexInformer{svcs.Informer(), slices.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			return nil, fmt.Errorf("watching: %w", err)
		}
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return nil, fmt.Errorf("syncing %v: %w", typ, context.Cause(ctx))
		}
	}
	rebuild := func() error {
		s, err := svcs.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("listing Services: %w", err)
		}
		e, err := slices.Lister().List(labels.Everything())
		if err != nil {
			return fmt.Errorf("listing EndpointSlices: %w", err)
		}
		zone.Store(BuildZone(domain, s, e))
		return nil
	}
	if err := rebuild(); err != nil {
		return nil, err
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-stale:
				if err := rebuild(); err != nil {
					log.Print(err)
				}
			}
		}
	}()
	return &zone, nil
}

// serve answers for domain from zone on addr, over UDP and TCP, until ctx
// ends or either fails.
func serve(ctx context.Context, addr, domain string, zone func() *Zone) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return fmt.Errorf("listening: %w", err)
	}
	go func() { <-ctx.Done(); pc.Close(); ln.Close() }()
	log.Printf("answering for %s on %s (udp, tcp)", domain, addr)
	errs := make(chan error, 2)
	go func() { errs <- serveUDP(pc, zone) }()
	go func() { errs <- serveTCP(ln, zone) }()
	err = <-errs
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func serveUDP(pc net.PacketConn, zone func() *Zone) error {
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("udp: %w", err)
		}
		rep, err := zone().Answer(buf[:n], true)
		if err != nil {
			continue // not a query: nothing to answer
		}
		_, _ = pc.WriteTo(rep, from)
	}
}

func serveTCP(ln net.Listener, zone func() *Zone) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("tcp: %w", err)
		}
		go func() {
			defer c.Close()
			if err := serveConn(c, zone); err != nil && !errors.Is(err, io.EOF) {
				log.Printf("tcp %s: %v", c.RemoteAddr(), err)
			}
		}()
	}
}

// serveConn answers the length-prefixed queries of one TCP connection
// (RFC 7766) until the client closes it or idles.
func serveConn(c net.Conn, zone func() *Zone) error {
	var l [2]byte
	buf := make([]byte, 65535)
	for {
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			return err
		}
		if _, err := io.ReadFull(c, l[:]); err != nil {
			return err
		}
		msg := buf[:binary.BigEndian.Uint16(l[:])]
		if _, err := io.ReadFull(c, msg); err != nil {
			return err
		}
		rep, err := zone().Answer(msg, false)
		if err != nil {
			return err
		}
		out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(rep)), uint16(len(rep)))
		if _, err := c.Write(append(out, rep...)); err != nil {
			return err
		}
	}
}
