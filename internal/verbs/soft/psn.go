package soft

// PSNs are 24 bits and wrap. psnDiff returns a-b as a signed distance in
// (-2^23, 2^23], the comparison IBA defines for PSN windows.
func psnDiff(a, b uint32) int32 { return int32((a-b)<<8) >> 8 }

func psnAdd(a uint32, n uint32) uint32 { return (a + n) & psnMask }

const psnMask = 1<<24 - 1

// rnrTimerTable is IBA table 45: the RNR NAK timer field in microseconds.
var rnrTimerTable = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}
