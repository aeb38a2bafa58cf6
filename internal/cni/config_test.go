package cni

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		code     uint // 0: valid
		sock     string
		policy   Policy
		timeout  time.Duration
		prev     bool
	}{
		{name: "defaults", in: `{"cniVersion":"1.0.0","name":"n","type":"rdmavisor-cni"}`,
			sock: config.DefaultAdminSocket, policy: FailOpen, timeout: DefaultTimeout},
		{name: "every field", in: `{"cniVersion":"1.1.0","name":"n","type":"rdmavisor-cni","adminSocket":"/run/a.sock","failurePolicy":"fail-closed","timeout":"250ms","prevResult":` + testPrevResult + `}`,
			sock: "/run/a.sock", policy: FailClosed, timeout: 250 * time.Millisecond, prev: true},
		{name: "0.3.1 prevResult without version", in: `{"cniVersion":"0.3.1","name":"n","type":"rdmavisor-cni","prevResult":{"ips":[{"version":"4","address":"10.0.0.2/24"}]}}`,
			sock: config.DefaultAdminSocket, policy: FailOpen, timeout: DefaultTimeout, prev: true},
		{name: "unknown fields are the runtime's", in: `{"cniVersion":"1.0.0","name":"n","type":"rdmavisor-cni","runtimeConfig":{"x":1},"args":{"cni":{}}}`,
			sock: config.DefaultAdminSocket, policy: FailOpen, timeout: DefaultTimeout},
		{name: "not JSON", in: `{"cniVersion":`, code: types.ErrDecodingFailure},
		{name: "wrong type", in: `{"cniVersion":"1.0.0","name":"n","adminSocket":7}`, code: types.ErrDecodingFailure},
		{name: "no version", in: `{"name":"n"}`, code: types.ErrIncompatibleCNIVersion},
		{name: "future version", in: `{"cniVersion":"1.2.0","name":"n"}`, code: types.ErrIncompatibleCNIVersion},
		{name: "empty adminSocket", in: `{"cniVersion":"1.0.0","name":"n","adminSocket":""}`, code: types.ErrInvalidNetworkConfig},
		{name: "long adminSocket", in: `{"cniVersion":"1.0.0","name":"n","adminSocket":"/` + strings.Repeat("a", 107) + `"}`, code: types.ErrInvalidNetworkConfig},
		{name: "bad policy", in: `{"cniVersion":"1.0.0","name":"n","failurePolicy":"FailOpen"}`, code: types.ErrInvalidNetworkConfig},
		{name: "zero timeout", in: `{"cniVersion":"1.0.0","name":"n","timeout":"0s"}`, code: types.ErrInvalidNetworkConfig},
		{name: "huge timeout", in: `{"cniVersion":"1.0.0","name":"n","timeout":"2h"}`, code: types.ErrInvalidNetworkConfig},
		{name: "bad prevResult", in: `{"cniVersion":"1.0.0","name":"n","prevResult":{"ips":[{"address":"nope"}]}}`, code: types.ErrDecodingFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig([]byte(tc.in))
			if tc.code != 0 {
				var e *types.Error
				if !errors.As(err, &e) || e.Code != tc.code {
					t.Fatalf("ParseConfig: %v, want CNI code %d", err, tc.code)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.AdminSocket != tc.sock || c.FailurePolicy != tc.policy || c.Timeout != tc.timeout || (c.PrevResult != nil) != tc.prev {
				t.Errorf("got socket %q policy %q timeout %v prevResult %v", c.AdminSocket, c.FailurePolicy, c.Timeout, c.PrevResult)
			}
		})
	}
}

func TestParseArgs(t *testing.T) {
	got := ParseArgs("IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=1234-5678;junk")
	if want := (PodRef{UID: "1234-5678", Namespace: "kube-system", Name: "coredns-1"}); got != want {
		t.Errorf("ParseArgs: %+v, want %+v", got, want)
	}
	if got := ParseArgs(""); got.complete() {
		t.Errorf("empty CNI_ARGS: %+v", got)
	}
}

func TestPodIPs(t *testing.T) {
	c, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","prevResult":` + testPrevResult + `}`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		t.Fatal(err)
	}
	if got := PodIPs(res); !reflect.DeepEqual(got, []string{"10.1.2.3", "fd00::3"}) {
		t.Errorf("sandbox IPs: %v", got)
	}
	res.Interfaces = nil // no interface information: every IP
	for _, ip := range res.IPs {
		ip.Interface = nil
	}
	if got := PodIPs(res); !reflect.DeepEqual(got, []string{"10.1.2.3", "fd00::3", "192.168.0.9"}) {
		t.Errorf("all IPs: %v", got)
	}
}
