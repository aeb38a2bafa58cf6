//go:build e2e

package e2e

import (
	"fmt"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The agents' allocations, as the suite reads them from each agent.

type allocation struct {
	ID     string
	VConns int
	Pod    string // namespace/name, once the device plugin bound it
}

func (e *env) allocations(node string) []allocation {
	var allocs []allocation
	e.agentState(node, "allocations", &allocs)
	return allocs
}

// liveAllocations are the allocations of node's agent bound to pods that
// still exist: those of pods an earlier step deleted are collected within
// two minutes, and must not be waited for.
func (e *env) liveAllocations(node string) []allocation {
	e.t.Helper()
	var live []allocation
	for _, a := range e.allocations(node) {
		ns, name, ok := strings.Cut(a.Pod, "/")
		if !ok {
			continue
		}
		p, err := e.kube.CoreV1().Pods(ns).Get(e.ctx, name, metav1.GetOptions{})
		if err == nil && p.DeletionTimestamp == nil {
			live = append(live, a)
		} else if err != nil && !apierrors.IsNotFound(err) {
			e.t.Fatal(err)
		}
	}
	return live
}

// allocationsBackTo waits until the agent on node holds the allocations
// want (those it held before a pod that is gone now came) and no other,
// and its status counts their vconns as allocated. Nothing tells the agent
// that a pod went: the device plugin deletes the allocation of a pod the
// real kubelet's pod-resources API no longer lists, in a garbage
// collection pass every minute that spares allocations younger than a
// minute (deviceplugin.DefaultGCInterval and DefaultGCGrace); so within
// three.
func (e *env) allocationsBackTo(node string, want []allocation) {
	e.t.Helper()
	ids, quota := []string{}, 0
	for _, a := range want {
		ids = append(ids, a.ID)
		quota += a.VConns
	}
	slices.Sort(ids)
	e.eventually("the agent on "+node+" releases the allocations of pods that are gone", 3*time.Minute, func() (bool, string) {
		got := []string{}
		for _, a := range e.allocations(node) {
			got = append(got, a.ID)
		}
		slices.Sort(got)
		var st struct{ Allocated int }
		e.agentState(node, "status", &st)
		return slices.Equal(got, ids) && st.Allocated == quota,
			fmt.Sprintf("allocations %v (%d vconns allocated), want %v (%d)", got, st.Allocated, ids, quota)
	})
}
