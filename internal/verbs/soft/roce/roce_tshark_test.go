package roce

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// TestTsharkDecodesRoCEv2 sends packets of this package from a real UDP
// socket over loopback, captures them with tshark, and checks that
//   - tshark's InfiniBand dissector (RoCEv2 on UDP) reads each with exactly
//     the opcode, destination QP, PSN and extended headers sent, and finds
//     the ICRC in the last 4 bytes (tshark shows the ICRC but does not
//     verify it: Wireshark 4.0 has no ICRC check or preference for one);
//   - the ICRC is right for the IP and UDP headers the kernel really sent,
//     by the reference implementation of icrc_test.go, and those headers
//     are what the pseudo header assumes (IPv4 id 0, DF);
//   - the receiving socket gets datagrams that Decode accepts.
func TestTsharkDecodesRoCEv2(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Fatalf("tshark is not installed (%v): .ci/run installs it (apt-get install tshark); this test needs it to check the RoCEv2 framing", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// The receiver takes 4791 when it is free, so tshark's default
	// RoCEv2 port mapping is exercised; else any port, mapped with -d.
	recv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: DefaultPort})
	if err != nil {
		recv, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
	}
	defer recv.Close()
	send, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer send.Close()
	// The pseudo header assumes IPv4 id 0 and DF: what Linux sends from an
	// unconnected socket with IP_PMTUDISC_DO.
	rc, err := send.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, syscall.IP_MTU_DISCOVER, syscall.IP_PMTUDISC_DO)
	}); err != nil || serr != nil {
		t.Fatalf("IP_MTU_DISCOVER: %v %v", err, serr)
	}
	dstAddr := recv.LocalAddr().(*net.UDPAddr).AddrPort()
	srcAddr := send.LocalAddr().(*net.UDPAddr).AddrPort()
	src := Endpoint{GID: verbs.GIDFromAddr(srcAddr.Addr()), Port: srcAddr.Port()}
	dst := Endpoint{GID: verbs.GIDFromAddr(dstAddr.Addr()), Port: dstAddr.Port()}
	var decodeAs []string
	if dst.Port != DefaultPort {
		decodeAs = []string{"-d", fmt.Sprintf("udp.port==%d,infiniband", dst.Port)}
	}
	t.Logf("%v:%d → %v:%d, tshark options %q", src.GID, src.Port, dst.GID, dst.Port, decodeAs)

	packets := []struct {
		h       Header
		payload string
	}{
		{Header{Opcode: RCSendOnly, PKey: 0xffff, DestQPN: 0x11, PSN: 1, AckReq: true}, "hello, rdma"},
		{Header{Opcode: RCWriteFirst, PKey: 0xffff, DestQPN: 0x123456, PSN: 0xfffffe, VA: 0x7f0012345678, RKey: 0xdeadbeef, DMALen: 8192}, strings.Repeat("w", 256)},
		{Header{Opcode: RCAck, PKey: 0xffff, DestQPN: 0xabcdef, PSN: 0x7fffff, Syndrome: AckSyndrome(CreditsInvalid), MSN: 0x10203}, ""},
		{Header{Opcode: RCAck, PKey: 0xffff, DestQPN: 0x12, PSN: 5, Syndrome: NakSyndrome(NakPSNSequence), MSN: 4}, ""},
		{Header{Opcode: UDSendOnly, PKey: 0xffff, DestQPN: 0x42, PSN: 0x100, QKey: 0x11111111, SrcQPN: 0x33}, "datagram!"},
		{Header{Opcode: RCReadRequest, PKey: 0xffff, DestQPN: 0x13, PSN: 9, VA: 0x1000, RKey: 0x1234, DMALen: 4096}, ""},
		{Header{Opcode: RCReadResponseOnly, PKey: 0xffff, DestQPN: 0x14, PSN: 9, Syndrome: AckSyndrome(3), MSN: 2}, "read data"},
		{Header{Opcode: UCSendOnlyImm, PKey: 0xffff, DestQPN: 0x15, PSN: 0xffffff, Imm: 0xcafef00d}, "uc"},
	}
	wires := make([][]byte, len(packets))
	for i, p := range packets {
		wires[i] = mustEncode(p.h, []byte(p.payload), src, dst)
	}

	// Capture.
	pcap := filepath.Join(t.TempDir(), "roce.pcap")
	capture := exec.CommandContext(ctx, tshark, "-i", "lo",
		"-f", fmt.Sprintf("udp and src port %d and dst port %d", src.Port, dst.Port),
		"-w", pcap, "-F", "pcap", "-c", strconv.Itoa(len(packets)), "-a", "duration:20")
	var log syncBuffer
	capture.Stderr = &log
	capture.WaitDelay = 2 * time.Second
	if err := capture.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- capture.Wait() }()
	defer func() {
		capture.Process.Kill()
		<-exited
	}()
	waitCapturing(t, &log, exited)

	for _, w := range wires {
		if _, err := send.WriteToUDPAddrPort(w, dstAddr); err != nil {
			t.Fatal(err)
		}
	}
	// The receiver gets what was sent, and Decode accepts it with the
	// datagram's source as src.
	buf := make([]byte, MaxPacketLen(4096))
	recv.SetReadDeadline(time.Now().Add(5 * time.Second))
	for i, p := range packets {
		n, from, err := recv.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("receiving packet %d: %v", i, err)
		}
		var h Header
		payload, err := Decode(buf[:n], &h, Endpoint{verbs.GIDFromAddr(from.Addr()), from.Port()}, dst)
		want := p.h
		want.PadCount = uint8(-len(p.payload) & 3)
		if err != nil || h != want || string(payload) != p.payload {
			t.Errorf("received packet %d: %v %+v %q", i, err, h, payload)
		}
	}
	select {
	case err := <-exited:
		exited <- err // for the deferred cleanup
		if err != nil {
			t.Fatalf("tshark capture: %v\n%s", err, log.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("tshark captured fewer than %d packets in 10s\n%s", len(packets), log.String())
	}

	// What the kernel put on the wire.
	frames := readPcap(t, pcap)
	if len(frames) != len(packets) {
		t.Fatalf("captured %d packets, sent %d\n%s", len(frames), len(packets), log.String())
	}
	for i, f := range frames {
		ip, udp, pkt := f[14:34], f[34:42], f[42:]
		if f[12] != 0x08 || f[13] != 0x00 || ip[0] != 0x45 {
			t.Fatalf("frame %d is not IPv4 without options: % x", i, f[:34])
		}
		if id, flags := binary.BigEndian.Uint16(ip[4:]), binary.BigEndian.Uint16(ip[6:]); id != ipv4ID || flags != ipv4Flags {
			t.Errorf("frame %d: IPv4 id %#x flags %#x, the pseudo header assumes %#x %#x", i, id, flags, ipv4ID, ipv4Flags)
		}
		if !bytes.Equal(pkt, wires[i]) {
			t.Errorf("frame %d: UDP payload differs from the packet sent", i)
		}
		if got, want := binary.LittleEndian.Uint32(pkt[len(pkt)-4:]), refICRC(ip, udp, pkt[:len(pkt)-4]); got != want {
			t.Errorf("frame %d: ICRC %#08x, reference over the captured headers %#08x", i, got, want)
		}
	}

	// What tshark makes of it.
	fields := []string{
		"frame.protocols", "infiniband.bth.opcode", "infiniband.bth.destqp", "infiniband.bth.psn",
		"infiniband.bth.padcnt", "infiniband.invariant.crc",
		"infiniband.reth.va", "infiniband.reth.r_key", "infiniband.reth.dmalen",
		"infiniband.aeth.syndrome", "infiniband.aeth.msn",
		"infiniband.deth.q_key", "infiniband.deth.srcqp",
	}
	args := append([]string{"-r", pcap, "-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"}, decodeAs...)
	args = append(args, disablePayloadHeuristics(ctx, tshark)...)
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	out, err := exec.CommandContext(ctx, tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark -r: %v", err)
	}
	rows := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(rows) != len(packets) {
		t.Fatalf("tshark read %d packets, want %d:\n%s", len(rows), len(packets), out)
	}
	for i, row := range rows {
		p := packets[i]
		got := map[string]string{}
		for j, v := range strings.Split(row, "\t") {
			got[fields[j]] = v
		}
		name := p.h.Opcode.String()
		if !strings.Contains(got["frame.protocols"], ":udp:infiniband") {
			t.Errorf("packet %d (%s): protocols %q, not InfiniBand", i, name, got["frame.protocols"])
			continue
		}
		want := map[string]uint64{
			"infiniband.bth.opcode":    uint64(p.h.Opcode),
			"infiniband.bth.destqp":    uint64(p.h.DestQPN),
			"infiniband.bth.psn":       uint64(p.h.PSN),
			"infiniband.bth.padcnt":    uint64(-len(p.payload) & 3),
			"infiniband.invariant.crc": uint64(binary.BigEndian.Uint32(wires[i][len(wires[i])-4:])), // shown as a big-endian number
		}
		if p.h.Opcode.HasRETH() {
			want["infiniband.reth.va"], want["infiniband.reth.r_key"], want["infiniband.reth.dmalen"] = p.h.VA, uint64(p.h.RKey), uint64(p.h.DMALen)
		}
		if p.h.Opcode.HasAETH() {
			want["infiniband.aeth.syndrome"], want["infiniband.aeth.msn"] = uint64(p.h.Syndrome), uint64(p.h.MSN)
		}
		if p.h.Opcode.HasDETH() {
			want["infiniband.deth.q_key"], want["infiniband.deth.srcqp"] = uint64(p.h.QKey), uint64(p.h.SrcQPN)
		}
		for _, f := range fields[1:] {
			w, ok := want[f]
			if !ok {
				if got[f] != "" {
					t.Errorf("packet %d (%s): %s = %q, want none", i, name, f, got[f])
				}
				continue
			}
			v, err := strconv.ParseUint(got[f], 0, 64)
			if err != nil || v != w {
				t.Errorf("packet %d (%s): %s = %q, want %#x", i, name, f, got[f], w)
			}
		}
	}
}

// syncBuffer collects tshark's stderr while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitCapturing returns once tshark's capture child has the interface open
// and its filter set: tshark logs "Capture started" when dumpcap reports its
// file, after opening the interface. "Capturing on" alone is printed before
// dumpcap starts; a tshark that never logs "Capture started" gets 2 s more.
func waitCapturing(t *testing.T, log *syncBuffer, exited chan error) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	var grace time.Time
	for {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("tshark exited before capturing: %v\n%s", err, log.String())
		case <-time.After(10 * time.Millisecond):
		}
		s := log.String()
		if strings.Contains(s, "Capture started") {
			return
		}
		if grace.IsZero() && strings.Contains(s, "Capturing on") {
			grace = time.Now().Add(2 * time.Second)
		}
		if !grace.IsZero() && time.Now().After(grace) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tshark not capturing after 15s:\n%s", s)
		}
	}
}

// disablePayloadHeuristics returns tshark options that turn off the
// protocols that guess at InfiniBand payloads (RPC-over-RDMA, SMB Direct,
// iSER...): one claiming a payload hides the ICRC field.
func disablePayloadHeuristics(ctx context.Context, tshark string) []string {
	out, _ := exec.CommandContext(ctx, tshark, "-G", "heuristic-decodes").Output()
	var args []string
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Split(l, "\t")
		if len(f) >= 2 && f[0] == "infiniband.payload" && f[1] != "ethertype" {
			args = append(args, "--disable-protocol", f[1])
		}
	}
	return args
}

// readPcap returns the frames of a libpcap file of Ethernet frames.
func readPcap(t *testing.T, path string) [][]byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 24 {
		t.Fatalf("pcap file of %d bytes", len(data))
	}
	var bo binary.ByteOrder = binary.LittleEndian
	switch binary.LittleEndian.Uint32(data) {
	case 0xa1b2c3d4, 0xa1b23c4d:
	case 0xd4c3b2a1, 0x4d3cb2a1:
		bo = binary.BigEndian
	default:
		t.Fatalf("not a pcap file: % x", data[:4])
	}
	if lt := bo.Uint32(data[20:]); lt != 1 {
		t.Fatalf("link type %d, want Ethernet", lt)
	}
	var frames [][]byte
	r := bytes.NewReader(data[24:])
	for {
		var rec [16]byte
		if _, err := io.ReadFull(r, rec[:]); err == io.EOF {
			return frames
		} else if err != nil {
			t.Fatal(err)
		}
		f := make([]byte, bo.Uint32(rec[8:]))
		if _, err := io.ReadFull(r, f); err != nil {
			t.Fatal(err)
		}
		if len(f) < 14+20+8+BTHLen+ICRCLen {
			t.Fatalf("short frame % x", f)
		}
		frames = append(frames, f)
	}
}
