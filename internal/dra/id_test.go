package dra

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/rdmavisor/rdmavisor/internal/admin/admintest"
)

// agentID is what the agent takes for an allocation id
// (internal/agent's allocID).
var agentID = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// driverWithKey is a driver over fa whose key is in keyFile.
func driverWithKey(t *testing.T, fa *admintest.Agent, specDir, keyFile string) *Driver {
	t.Helper()
	d, err := New(Options{NodeName: "node-a", SocketDir: "/run/rv", Agent: fa, CDISpecDir: specDir, KeyFile: keyFile, Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func unprepare(t *testing.T, d *Driver, c *resourceapi.ResourceClaim) {
	t.Helper()
	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{NamespacedName: types.NamespacedName{Namespace: "ns", Name: c.Name}, UID: c.UID}})
	if err != nil || res[c.UID] != nil {
		t.Fatalf("unprepare: %v, %v", err, res[c.UID])
	}
}

// TestAllocationIDKeyed: a claim's allocation id, a capability on its
// socket path, cannot be told from the claim's UID, which anyone who may
// read the claim knows: it is "dra-" and 32 hex digits keyed by the
// driver's key (figure: the id is not "dra-<UID>" and holds no part of
// it). The key is kept (mode 0600): a restarted driver maps the claim to
// the same id and unprepares it; another key gives another id. An
// allocation an older driver named "dra-<UID>" goes at unprepare too.
func TestAllocationIDKeyed(t *testing.T) {
	fa := newFakeAgent(8)
	specs, keyFile := t.TempDir(), filepath.Join(t.TempDir(), "allocation-id.key")
	d := driverWithKey(t, fa, specs, keyFile)
	c := claim(uid1, []string{"p"}, result("r1", 2))
	res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{c})
	if err != nil || res[c.UID].Err != nil {
		t.Fatalf("prepare: %v, %v", err, res[c.UID].Err)
	}
	id := d.allocationID(c.UID)
	t.Logf("claim %s: allocation %s", uid1, id)
	hex, ok := strings.CutPrefix(id, allocPrefix)
	if !ok || len(hex) != 32 || strings.Trim(hex, "0123456789abcdef") != "" || !agentID.MatchString(id) {
		t.Errorf("allocation id %q, want %q and 32 hex digits", id, allocPrefix)
	}
	if id == legacyID(c.UID) || strings.Contains(id, uid1[:8]) {
		t.Errorf("allocation id %q is derived from the claim's UID %s alone", id, uid1)
	}
	if got := fa.IDs(); !slices.Equal(got, []string{id}) {
		t.Errorf("the agent's allocations %v, want [%s]", got, id)
	}
	if fi, err := os.Stat(keyFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v; want mode 0600", fi, err)
	}

	// Restarted: the same key, the same id, and the claim unprepares.
	again := driverWithKey(t, fa, specs, keyFile)
	if got := again.allocationID(c.UID); got != id {
		t.Errorf("a restarted driver maps the claim to %s, want %s", got, id)
	}
	other := driverWithKey(t, newFakeAgent(8), t.TempDir(), filepath.Join(t.TempDir(), "key"))
	if got := other.allocationID(c.UID); got == id {
		t.Errorf("another key maps the claim to the same id %s", id)
	}
	unprepare(t, again, c)
	if got := fa.IDs(); len(got) != 0 {
		t.Errorf("after a restarted driver's unprepare, allocations %v remain", got)
	}

	// Prepared by an older driver, as dra-<UID>.
	old := legacyID(c.UID)
	if _, err := fa.CreateAllocation(context.Background(), old, 2); err != nil {
		t.Fatal(err)
	}
	if err := again.specs.Write(old, again.edits(old, 2, "ns/p", 0)); err != nil {
		t.Fatal(err)
	}
	unprepare(t, again, c)
	if got := fa.IDs(); len(got) != 0 {
		t.Errorf("an older driver's allocation %s left after unprepare: %v", old, got)
	}
	if names, _ := again.specs.Names(); len(names) != 0 {
		t.Errorf("an older driver's spec left after unprepare: %v", names)
	}
}
