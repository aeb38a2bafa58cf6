package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// Plugin-specific CNI error codes (the spec leaves 100 and up to plugins).
const (
	// ErrAgentRejected: the agent answered ADD's registration with an error.
	ErrAgentRejected uint = 100
	// ErrNotRegistered: CHECK found the pod unregistered, or registered
	// with other IPs, netns or container.
	ErrNotRegistered uint = 101
)

// Plugin serves the CNI commands. Its methods have skel's signature.
type Plugin struct {
	// Stdout receives ADD's result.
	Stdout io.Writer
	// Log receives warnings (fail-open, DEL with the agent down); the
	// binary logs to stderr, which runtimes keep in their own logs.
	Log logr.Logger
}

// Funcs returns the plugin's commands for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Del: p.Del, Check: p.Check, Status: p.Status, GC: p.GC}
}

// agentDown reports whether err means the agent could not be reached, as
// opposed to an answer: a refused or missing socket, a timeout, a
// connection closed mid-request.
func agentDown(err error) bool {
	var ae *admin.Error
	return !errors.As(err, &ae)
}

// timedOut reports whether err is a timeout: the agent hangs, so trying
// again within the same call is no use.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// withAgent connects to the agent and runs f within the configured timeout.
func withAgent(conf *Config, f func(context.Context, *admin.Client) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), conf.Timeout)
	defer cancel()
	c, err := admin.Dial(ctx, conf.AdminSocket)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(ctx, c)
}

// chained parses the configuration of ADD and CHECK, which need the
// primary plugin's result.
func chained(args *skel.CmdArgs) (*Config, *current.Result, error) {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return nil, nil, err
	}
	if conf.PrevResult == nil {
		return nil, nil, types.NewError(types.ErrInvalidNetworkConfig, "rdmavisor-cni: prevResult missing",
			"rdmavisor-cni is a chained plugin: list it after the plugin that creates the pod's interfaces in a conflist")
	}
	res, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, nil, types.NewError(types.ErrDecodingFailure, "rdmavisor-cni: converting prevResult", err.Error())
	}
	return conf, res, nil
}

// PodIPs returns the IPs of the pod in a result: those on interfaces in the
// sandbox, or every IP when the result does not say which interface an IP
// belongs to.
func PodIPs(res *current.Result) []string {
	var inSandbox, all []string
	for _, ip := range res.IPs {
		if ip == nil || ip.Address.IP == nil {
			continue
		}
		s := ip.Address.IP.String()
		if !slices.Contains(all, s) {
			all = append(all, s)
		}
		if i := ip.Interface; i != nil && *i >= 0 && *i < len(res.Interfaces) && res.Interfaces[*i].Sandbox != "" && !slices.Contains(inSandbox, s) {
			inSandbox = append(inSandbox, s)
		}
	}
	if len(inSandbox) > 0 {
		return inSandbox
	}
	return all
}

// Add registers the pod with the agent and passes prevResult through.
func (p *Plugin) Add(args *skel.CmdArgs) error {
	conf, res, err := chained(args)
	if err != nil {
		return err
	}
	pass := func() error {
		out, err := conf.PrevResult.GetAsVersion(conf.CNIVersion)
		if err != nil {
			return types.NewError(types.ErrIncompatibleCNIVersion, "rdmavisor-cni: converting prevResult", err.Error())
		}
		return out.PrintTo(p.Stdout)
	}
	log := p.Log.WithValues("containerID", args.ContainerID)
	ref := ParseArgs(args.Args)
	if !ref.complete() {
		if conf.FailurePolicy == FailClosed {
			return types.NewError(types.ErrInvalidEnvironmentVariables, "rdmavisor-cni: CNI_ARGS lacks the pod's identity",
				"K8S_POD_UID, K8S_POD_NAMESPACE and K8S_POD_NAME are required (failurePolicy fail-closed)")
		}
		log.Info("Passing the pod through unregistered: CNI_ARGS lacks K8S_POD_UID, K8S_POD_NAMESPACE or K8S_POD_NAME", "args", args.Args)
		return pass()
	}
	pod := admin.Pod{UID: ref.UID, Namespace: ref.Namespace, Name: ref.Name, IPs: PodIPs(res), Netns: args.Netns, ContainerID: args.ContainerID}
	err = withAgent(conf, func(ctx context.Context, c *admin.Client) error { return c.RegisterPod(ctx, pod) })
	switch {
	case err == nil:
	case !agentDown(err):
		return types.NewError(ErrAgentRejected, "rdmavisor-cni: the agent refused to register pod "+ref.String(), err.Error())
	case conf.FailurePolicy == FailClosed:
		return types.NewError(types.ErrTryAgainLater, "rdmavisor-cni: the RDMAvisor agent is unreachable (failurePolicy fail-closed)",
			fmt.Sprintf("admin socket %s: %v", conf.AdminSocket, err))
	default:
		log.Error(err, "Starting the pod unregistered: the RDMAvisor agent is unreachable (failurePolicy fail-open); its vconn calls will fail",
			"pod", ref.String(), "adminSocket", conf.AdminSocket)
	}
	return pass()
}

// Del unregisters the pod. It succeeds whenever the configuration parses:
// an agent that is down or does not know the pod is not an error (an
// agent that restarts has forgotten its pods). A DEL for a
// container other than the one the pod is registered with (a late DEL of
// a replaced sandbox) leaves the registration alone. Without a pod UID in
// CNI_ARGS, the pods registered with this container ID are unregistered.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	ref := ParseArgs(args.Args)
	log := p.Log.WithValues("containerID", args.ContainerID, "pod", ref.String())
	var pods []admin.Pod
	listErr := withAgent(conf, func(ctx context.Context, c *admin.Client) (err error) {
		pods, err = c.ListPods(ctx)
		return err
	})
	var uids []string
	switch {
	case ref.UID != "" && listErr != nil && !timedOut(listErr):
		// Listing failed but the agent may still unregister (the list may
		// have outgrown an admin message): try, on a fresh connection.
		uids = []string{ref.UID}
	case listErr != nil:
		err = listErr
	case ref.UID != "":
		i := slices.IndexFunc(pods, func(pod admin.Pod) bool { return pod.UID == ref.UID })
		if i >= 0 && pods[i].ContainerID != "" && args.ContainerID != "" && pods[i].ContainerID != args.ContainerID {
			log.Info("Leaving the pod registered: it belongs to another container (a stale DEL)", "registeredContainerID", pods[i].ContainerID)
			return nil
		}
		uids = []string{ref.UID}
	default:
		for _, pod := range pods {
			if pod.ContainerID == args.ContainerID {
				uids = append(uids, pod.UID)
			}
		}
	}
	if len(uids) > 0 {
		// A fresh connection: the agent closes one whose request failed.
		err = withAgent(conf, func(ctx context.Context, c *admin.Client) error {
			var errs []error
			for _, uid := range uids {
				errs = append(errs, c.UnregisterPod(ctx, uid))
			}
			return errors.Join(errs...)
		})
	}
	if err != nil {
		log.Error(err, "Could not unregister the pod from the RDMAvisor agent; DEL succeeds anyway (an agent that restarts forgets its pods)", "adminSocket", conf.AdminSocket)
	}
	return nil
}

// Check verifies that the agent holds the pod's registration as ADD made
// it. An unreachable agent fails CHECK only under fail-closed.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	conf, res, err := chained(args)
	if err != nil {
		return err
	}
	ref := ParseArgs(args.Args)
	if !ref.complete() {
		if conf.FailurePolicy == FailClosed {
			return types.NewError(types.ErrInvalidEnvironmentVariables, "rdmavisor-cni: CNI_ARGS lacks the pod's identity",
				"K8S_POD_UID, K8S_POD_NAMESPACE and K8S_POD_NAME are required (failurePolicy fail-closed)")
		}
		return nil // ADD passed it through unregistered
	}
	var pods []admin.Pod
	err = withAgent(conf, func(ctx context.Context, c *admin.Client) (err error) {
		pods, err = c.ListPods(ctx)
		return err
	})
	if err != nil {
		if agentDown(err) && conf.FailurePolicy == FailOpen {
			p.Log.Error(err, "Cannot verify the pod's registration: the RDMAvisor agent is unreachable (failurePolicy fail-open)", "pod", ref.String())
			return nil
		}
		return types.NewError(types.ErrTryAgainLater, "rdmavisor-cni: cannot list the RDMAvisor agent's pods", err.Error())
	}
	i := slices.IndexFunc(pods, func(pod admin.Pod) bool { return pod.UID == ref.UID })
	if i < 0 {
		return types.NewError(ErrNotRegistered, "rdmavisor-cni: pod "+ref.String()+" is not registered with the agent", "")
	}
	want := admin.Pod{UID: ref.UID, Namespace: ref.Namespace, Name: ref.Name, IPs: PodIPs(res), Netns: args.Netns, ContainerID: args.ContainerID}
	if diff := podDiff(pods[i], want); diff != "" {
		return types.NewError(ErrNotRegistered, "rdmavisor-cni: pod "+ref.String()+" is registered differently", diff)
	}
	return nil
}

// podDiff describes how the registration got differs from want.
func podDiff(got, want admin.Pod) string {
	var d []string
	field := func(name, g, w string) {
		if g != w {
			d = append(d, fmt.Sprintf("%s %q, want %q", name, g, w))
		}
	}
	field("namespace", got.Namespace, want.Namespace)
	field("name", got.Name, want.Name)
	field("containerID", got.ContainerID, want.ContainerID)
	field("netns", got.Netns, want.Netns)
	g, w := slices.Clone(got.IPs), slices.Clone(want.IPs)
	slices.Sort(g)
	slices.Sort(w)
	if !slices.Equal(g, w) {
		d = append(d, fmt.Sprintf("ips %v, want %v", got.IPs, want.IPs))
	}
	return strings.Join(d, "; ")
}

// Status reports the agent's readiness. Under fail-closed an agent that is
// unreachable or not ready fails STATUS (code 50, plugin not available),
// which keeps the runtime from creating pods; under fail-open, where pods
// start without the agent, it is logged and STATUS succeeds.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	var st admin.Status
	err = withAgent(conf, func(ctx context.Context, c *admin.Client) (err error) {
		st, err = c.Status(ctx)
		return err
	})
	if err == nil && !st.Ready {
		err = errors.New("the agent is not ready")
	}
	if err == nil {
		return nil
	}
	if conf.FailurePolicy == FailOpen {
		p.Log.Error(err, "The RDMAvisor agent is not available; pods start without it (failurePolicy fail-open)", "adminSocket", conf.AdminSocket)
		return nil
	}
	return types.NewError(types.ErrPluginNotAvailable, "rdmavisor-cni: the RDMAvisor agent is not available", fmt.Sprintf("admin socket %s: %v", conf.AdminSocket, err))
}

// GC unregisters the pods whose container is not among the runtime's
// valid attachments (CNI 1.1). Pods registered without a container ID are
// kept. An unreachable agent is not an error.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	valid := make(map[string]bool, len(conf.ValidAttachments))
	for _, a := range conf.ValidAttachments {
		valid[a.ContainerID] = true
	}
	err = withAgent(conf, func(ctx context.Context, c *admin.Client) error {
		pods, err := c.ListPods(ctx)
		if err != nil {
			return err
		}
		var errs []error
		for _, pod := range pods {
			if pod.ContainerID != "" && !valid[pod.ContainerID] {
				p.Log.Info("Unregistering a pod whose container is gone", "pod", pod.Namespace+"/"+pod.Name, "uid", pod.UID, "containerID", pod.ContainerID)
				errs = append(errs, c.UnregisterPod(ctx, pod.UID))
			}
		}
		return errors.Join(errs...)
	})
	if err != nil {
		p.Log.Error(err, "Garbage collection in the RDMAvisor agent failed", "adminSocket", conf.AdminSocket)
	}
	return nil
}
