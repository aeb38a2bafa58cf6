// Package interop holds the tests that run the software provider
// (internal/verbs/soft, on the UDP wire) against the Linux kernel's rxe
// (through internal/verbs/ibv) on one network: each side of every test is
// the same test binary, one on the host, one in an rxe guest, in lockstep
// over a TCP control connection; or the host side alone against rdma-core's
// ibv_rc_pingpong and perftest's ib_send_bw and ib_write_bw in the guest,
// speaking their own exchanges. hack/rxe-vm/interop.sh starts both sides.
// It has no code outside its tests.
//
// What running against rxe changed in the soft provider (tshark captures of
// both on one bridge were the evidence):
//
//   - rxe numbers its IPv4 datagrams and sends from UDP port 0xc000 plus a
//     hash of the QPN, and its ICRC covers both; the UDP wire now reports
//     the source port and package roce recovers the IPv4 id from the ICRC
//     (before, every packet of rxe failed our ICRC check);
//   - the UDP wire's Port went unreported to the device, which covered
//     4791 with the ICRC whatever port it was bound to;
//   - a read's responses carry the MSN that counts the read, as rxe's do
//     (ours counted it only after the last response);
//   - the GRH space of a UD receive holds the received IP header as rxe
//     writes it: for IPv4, 20 zero bytes and the IPv4 header (ours was an
//     IPv6-style header for every peer);
//   - IPv4 datagrams go without a UDP checksum (0), as rxe's do, where the
//     kernel does not segment them;
//   - a long message asks for an ACK on the packet after more than 64 that
//     did not, as rxe's RXE_MAX_PKT_PER_ACK (ours asked every 32), and on
//     the packet that fills the window;
//   - a duplicate SEND or WRITE packet is acknowledged whether it asks or
//     not (IBA C9-105), as rxe does (ours only when it asked);
//   - sequence NAKs are counted in NAKsSent (only error NAKs were).
package interop
