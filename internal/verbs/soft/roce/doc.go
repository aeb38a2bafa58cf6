// Package roce owns the RoCEv2 wire format of the software RDMA provider: the
// InfiniBand transport headers (BTH, RETH, AETH, ImmDt, DETH), payload, pad
// and ICRC that form the UDP payload of a RoCEv2 packet, framed exactly as
// the Linux rxe driver frames them (drivers/infiniband/sw/rxe), so that
// tshark's InfiniBand dissector and, on a real network, rxe or a RoCE NIC
// read them.
//
// Encode and Decode work in caller-owned buffers, never allocate and never
// panic on any input; errors are sentinels (ErrTruncated, ErrICRC, ...) to
// test with errors.Is. The payload Decode returns aliases the packet.
//
// # Opcodes
//
// The opcodes the provider uses: RC 0x00-0x11 (SEND, RDMA WRITE, RDMA READ
// request and responses, ACKNOWLEDGE), UC 0x20-0x2b (SEND, RDMA WRITE) and UD
// 0x64-0x65 (SEND_ONLY, SEND_ONLY_WITH_IMMEDIATE). Atomics, invalidates,
// RD, XRC and CNPs are not spoken: Decode refuses them with ErrOpcode.
//
// # ICRC
//
// The ICRC is the one of IBA Annex A17 (RoCEv2) as rxe_icrc.c computes it:
// the CRC-32 of the IEEE 802.3 polynomial, reflected, over
//
//  1. 8 bytes of 0xff standing for the masked LRH;
//  2. the IPv4 header with TOS, TTL and header checksum set to ones, or the
//     IPv6 header with traffic class, flow label and hop limit set to ones;
//  3. the UDP header with the checksum set to 0xffff;
//  4. the BTH with its resv8a byte (which holds FECN and BECN) set to 0xff;
//  5. the other transport headers, the payload and the pad;
//
// and stored after the pad as the inverted CRC register, little-endian (rxe:
// *icrcp = cpu_to_le32(~crc)). rxe starts its register at 0xdebb20e3, the
// value crc32_le(0xffffffff, eight 0xff bytes) leaves, instead of feeding the
// eight bytes. Go's crc32.Update inverts on entry and exit, so the ICRC is
// crc32.Update(^0xdebb20e3, crc32.IEEETable, 2..5), which also equals
// crc32.ChecksumIEEE over 1..5. The IP and UDP part of the pseudo header
// (2-4, plus the masked BTH) is built on the stack and run through a
// slicing-by-8 table here, because crc32.Update makes its argument escape;
// the rest runs through crc32.Update in place.
//
// # What the pseudo header assumes about the IP and UDP headers
//
// The ICRC covers IP and UDP header fields that this package never sees, so
// Seal and Decode rebuild them from what both ends know, and the wire must
// send exactly that:
//
//   - Addresses and ports come from the src and dst Endpoints: the GIDs
//     (IPv4 when both are IPv4-mapped, else IPv6; a mix is ErrAddrFamily)
//     and the UDP ports. The source port is covered too, so a receiver must
//     pass the port the packet came from, not its own configuration.
//   - Lengths follow from the packet length: UDP length 8+n, IPv4 total
//     length 28+n (no IP options), IPv6 payload length 8+n.
//   - IPv4 identification 0 and flags DF (0x4000, fragment offset 0). Linux
//     sends exactly that from an unconnected UDP socket with
//     IP_MTU_DISCOVER=IP_PMTUDISC_DO (ip_select_ident_segs sets id 0 on DF
//     packets of sockets without a connected peer), so the UDP wire must
//     use sendmsg/sendmmsg with per-packet addresses on such a socket, never
//     connect(2). rxe itself covers the id it chose and sets DF, so a packet
//     of ours checks out at rxe; a packet of rxe carries an id a UDP socket
//     does not deliver, so Decode recovers it from the ICRC (ipid.go) for
//     packets from a source port other than the receiver's (rxe sends from
//     0xc000 plus a hash of the QPN; our peers from the shared port).
//   - IPv6 has no identification; next header is UDP (17), no extension
//     headers.
//
// Receivers ignore reserved header bits, as IBA requires; the pad bytes must
// be zero (ErrPad), and a packet's length must be a multiple of 4.
package roce
