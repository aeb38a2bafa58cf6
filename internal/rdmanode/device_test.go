package rdmanode

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// reasoned is an error with a condition reason, as device.OpenError is.
type reasoned struct {
	reason string
	err    error
}

func (e reasoned) Error() string  { return e.err.Error() }
func (e reasoned) Reason() string { return e.reason }

// TestReporterDeviceNotOpen: an agent waiting for a device that does not
// open says so on its RDMANode, Ready and DeviceReady False with the
// reason and the error, each new error replacing the last; once the
// device opens and the agent starts, both turn True.
func TestReporterDeviceNotOpen(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var p Pending
	p.Fail(reasoned{"DeviceNotFound", errors.New(`ibv: no RDMA device matches names ["mlx5_9"]`)})
	r := &Reporter{Client: k8s, Node: "node-nodev", Service: "svc", Provider: v1alpha1.ProviderIBVerbs, Log: testr.New(t), Poll: 20 * time.Millisecond}
	done := make(chan struct{})
	go func() { defer close(done); r.Run(ctx, &p) }()
	t.Cleanup(func() { cancel(); <-done; _ = k8s.Delete(context.Background(), get(t, "node-nodev")) })

	cond := func(typ string) *metav1.Condition {
		rn := get(t, "node-nodev")
		if rn == nil {
			return nil
		}
		return meta.FindStatusCondition(rn.Status.Conditions, typ)
	}
	waitCond := func(typ string, status metav1.ConditionStatus, reason, msg string) {
		t.Helper()
		poll.Until(t, 20*time.Second, typ+" "+string(status)+" "+reason, func() bool {
			c := cond(typ)
			return c != nil && c.Status == status && c.Reason == reason && strings.Contains(c.Message, msg)
		})
	}
	waitCond(v1alpha1.ConditionDeviceReady, metav1.ConditionFalse, "DeviceNotFound", `no RDMA device matches names ["mlx5_9"]`)
	waitCond(v1alpha1.ConditionNodeReady, metav1.ConditionFalse, "DeviceNotFound", "cannot open the ibverbs device")

	p.Fail(reasoned{"PortDown", errors.New("ibv: port 1 of rxe0 is DOWN, not ACTIVE")})
	waitCond(v1alpha1.ConditionDeviceReady, metav1.ConditionFalse, "PortDown", "not ACTIVE")
	// An error without a reason is a DeviceOpenFailed.
	p.Fail(errors.New("ibv: open rxe0: permission denied"))
	waitCond(v1alpha1.ConditionDeviceReady, metav1.ConditionFalse, ReasonDeviceOpenFailed, "permission denied")

	p.Start(newFake(admin.Status{Ready: true, Node: "node-nodev", Capacity: 8, Device: "rxe0", GID: "10.99.0.2", Control: "10.99.0.2:7471"}))
	waitCond(v1alpha1.ConditionDeviceReady, metav1.ConditionTrue, ReasonDeviceOpen, "rxe0")
	waitCond(v1alpha1.ConditionNodeReady, metav1.ConditionTrue, ReasonServing, "")
}
