package netpol

import (
	"fmt"
	"strings"
)

// Refusal is the error of a verdict that refuses: it names the policies
// that isolate the pod, so that whoever is refused knows which to read.
type Refusal struct {
	Verdict Verdict
	Conn    Conn
}

func (r *Refusal) Error() string {
	v := r.Verdict
	ns, _, _ := strings.Cut(v.Pod, "/")
	what := "NetworkPolicy " + v.Isolating[0]
	if len(v.Isolating) > 1 {
		what = "NetworkPolicies " + strings.Join(v.Isolating, ", ")
	}
	peer, dir := r.Conn.From, "from"
	if v.Dir == "Egress" {
		peer, dir = r.Conn.To, "to"
	}
	return fmt.Sprintf("%s of namespace %s isolate%s pod %s for %s and allow%s nothing %s %s on port %d",
		what, ns, plural(v.Isolating), v.Pod, strings.ToLower(string(v.Dir)), plural(v.Isolating), dir, peerName(peer), r.Conn.Port)
}

// plural is the verb's "s" of one policy.
func plural(p []string) string {
	if len(p) == 1 {
		return "s"
	}
	return ""
}

func peerName(p Peer) string {
	switch {
	case p.Pod != nil:
		return fmt.Sprintf("pod %s/%s (%s)", p.Pod.Namespace, p.Pod.Name, p.Pod.IP)
	case p.Node != "" && p.IP.IsValid():
		return fmt.Sprintf("node %s (%s)", p.Node, p.IP)
	case p.Node != "":
		return "node " + p.Node
	case p.IP.IsValid():
		return p.IP.String()
	}
	return "an unknown host"
}

// Err is nil when v allows c, else a *Refusal.
func (v Verdict) Err(c Conn) error {
	if v.Allowed {
		return nil
	}
	return &Refusal{Verdict: v, Conn: c}
}
