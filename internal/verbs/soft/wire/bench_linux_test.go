package wire

import (
	"fmt"
	"testing"
)

func BenchmarkUDP(b *testing.B) {
	for _, off := range []bool{false, true} {
		for _, size := range benchSizes {
			for _, batch := range benchBatches {
				b.Run(fmt.Sprintf("nooffload=%v/size=%d/batch=%d", off, size, batch), func(b *testing.B) {
					a, r := udpPair(b, UDPConfig{NoOffload: off}, addr2, addr3)
					benchWire(b, a, r, size, batch)
				})
			}
		}
	}
}
