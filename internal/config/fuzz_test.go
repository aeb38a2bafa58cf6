package config

import (
	"reflect"
	"testing"
)

// FuzzLoad checks that Load never panics, and that whatever it accepts is
// valid and survives a Marshal/Load round trip unchanged.
func FuzzLoad(f *testing.F) {
	for _, seed := range []string{
		minimal,
		minimal + "device: {provider: soft}\nsoft: {udpPort: 4791, bindAddress: 10.0.0.1}\n",
		minimal + "device: {provider: ibverbs, names: [mlx5_0], vendors: [mellanox]}\ntransport: rc\n",
		minimal + "peerDiscovery: {mode: static, static: [{nodeName: a, address: '10.0.0.2:7471'}]}\n",
		minimal + "qpsPerPeer: 0\n",
		minimal + "unknown: 1\n",
		"{\"apiVersion\":\"rdmavisor.io/v1alpha1\",\"kind\":\"AgentConfig\",\"vconnsPerNode\":65536}",
		"apiVersion: [\n",
		"",
		"null",
		"- a\n- b\n",
		"&a [*a]",
		minimal + "device: {names: []}\npeerDiscovery: {mode: static, static: []}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Load(data)
		if err != nil {
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Load accepted an invalid config: %v", err)
		}
		out, err := cfg.Marshal()
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		again, err := Load(out)
		if err != nil {
			t.Fatalf("Load(Marshal()) = %v\n%s", err, out)
		}
		if !reflect.DeepEqual(cfg, again) {
			t.Fatalf("round trip changed the config:\n%+v\n%+v", cfg, again)
		}
	})
}
