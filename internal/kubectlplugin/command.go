package kubectlplugin

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// RBAC is what a user of the plugin needs, as its help and
// docs/kubectl-plugin.md say.
const RBAC = `RBAC: the plugin talks to the API server only, and to the agents through it.
A user needs:
  - get, list rdmaservices and rdmanodes (group rdmavisor.io), cluster-wide;
  - get, list pods, cluster-wide (the agent pods, the pods diagnosed, and a
    --to address looked up among the pods' IPs);
  - list events (group events.k8s.io) in the namespaces of the pods diagnosed;
  - create pods/portforward in the agents' namespace (the operator's,
    rdmavisor-system by default), and get on the non-resource URL /metrics:
    each agent's /metrics, over TLS through a port-forward, with the user's
    own credentials, which the agent has the API server review.
The chart makes a ClusterRole with these rules when kubectlPlugin.clusterRole.create
is true; bind it to the users (docs/kubectl-plugin.md).`

// Connect makes the Cluster the commands read, from the kubeconfig and
// the agents' namespace (empty: every namespace).
type Connect func(cfg clientcmd.ClientConfig, agentNamespace string) (*Cluster, error)

// ConnectAPIServer is the Connect of a real cluster.
func ConnectAPIServer(cfg clientcmd.ClientConfig, agentNamespace string) (*Cluster, error) {
	rc, err := cfg.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading kubeconfig: %w", err)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("making a Kubernetes client: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("registering the RDMAvisor API: %w", err)
	}
	crs, err := client.New(rc, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("making a client of the RDMAvisor API: %w", err)
	}
	return &Cluster{Kube: kube, CRs: crs, Metrics: ForwardSource{Config: rc, Kube: kube}, AgentNamespace: agentNamespace}, nil
}

// Run runs the plugin with args and returns its exit status: 1 on an
// error or a failed check.
func Run(ctx context.Context, args []string, out, errOut io.Writer, connect Connect) int {
	cmd := NewCommand(out, errOut, connect)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	if failed := (*ChecksFailed)(nil); errors.As(err, &failed) {
		fmt.Fprintln(errOut, failed)
	} else {
		fmt.Fprintln(errOut, "error:", err)
	}
	return 1
}

// options are the flags every command shares.
type options struct {
	out, errOut    io.Writer
	format         string
	agentNamespace string
	clientConfig   clientcmd.ClientConfig
	connect        Connect
}

func (o *options) cluster() (*Cluster, error) {
	if err := checkFormat(o.format); err != nil {
		return nil, err
	}
	return o.connect(o.clientConfig, o.agentNamespace)
}

// namespace is -n, else the kubeconfig context's, else default; explicit
// says whether -n was given.
func (o *options) namespace(cmd *cobra.Command) (ns string, explicit bool) {
	ns, _, err := o.clientConfig.Namespace()
	if err != nil || ns == "" {
		ns = "default"
	}
	return ns, cmd.Flags().Changed("namespace")
}

// warn says which agents could not be read, for the table forms (JSON and
// YAML carry them in errors).
func (o *options) warn(errs []string) {
	if o.format == formatJSON || o.format == formatYAML {
		return
	}
	for _, e := range errs {
		fmt.Fprintln(o.errOut, "warning: metrics of the agent on", e)
	}
}

// NewCommand is `kubectl rdmavisor` and its subcommands.
func NewCommand(out, errOut io.Writer, connect Connect) *cobra.Command {
	o := &options{out: out, errOut: errOut, connect: connect}
	root := &cobra.Command{
		Use:   "kubectl-rdmavisor",
		Short: "Inspect RDMAvisor: services, nodes, pods' vconns and traffic, and why a pod cannot reach an address",
		Long: "kubectl rdmavisor shows RDMAvisor's RDMAServices and RDMANodes, the pods holding vconns and their\n" +
			"traffic (from each agent's per-pod metrics), and diagnoses a pod's connectivity.\n\n" + RBAC,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl rdmavisor"},
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetOut(out)
	root.SetErr(errOut)
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	overrides := &clientcmd.ConfigOverrides{}
	flags := root.PersistentFlags()
	flags.StringVar(&rules.ExplicitPath, "kubeconfig", "", "Path to the kubeconfig file.")
	clientcmd.BindOverrideFlags(overrides, flags, clientcmd.RecommendedConfigOverrideFlags(""))
	o.clientConfig = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
	flags.StringVarP(&o.format, "output", "o", "", "Output format: json or yaml; tables when not set.")
	flags.StringVar(&o.agentNamespace, "agent-namespace", "",
		"Namespace of the agent pods (the operator's); empty: found in every namespace by their label app.kubernetes.io/name=rdmavisor-agent.")
	root.AddCommand(o.statusCommand(), o.podsCommand(), o.topCommand(), o.diagnoseCommand())
	return root
}

func (o *options) statusCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "RDMAServices (ready, nodes, vconns) and RDMANodes (ready, rails, peers, vconns)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return report(o, func(c *Cluster) (*StatusReport, error) { return c.Status(cmd.Context()) })
		},
	}
}

// reporter is what status, pods and top print: a table, or itself as
// JSON or YAML, with the errors met while gathering it.
type reporter interface {
	table(w io.Writer) error
	errs() []string
}

func (r *StatusReport) errs() []string { return r.Errors }
func (r *PodsReport) errs() []string   { return r.Errors }
func (r *TopReport) errs() []string    { return r.Errors }

// report gathers a report from the cluster, warns of what it could not
// read and writes it in the chosen format.
func report[R reporter](o *options, gather func(c *Cluster) (R, error)) error {
	c, err := o.cluster()
	if err != nil {
		return err
	}
	r, err := gather(c)
	if err != nil {
		return err
	}
	o.warn(r.errs())
	return write(o.out, o.format, r, r.table)
}

// namespaceOrAll is -n's namespace, or every namespace ("") without -n.
func (o *options) namespaceOrAll(cmd *cobra.Command) string {
	if ns, explicit := o.namespace(cmd); explicit {
		return ns
	}
	return ""
}

func (o *options) podsCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "pods",
		Short: "Pods holding vconns, by node: vconns open and quota, messages and bytes each way (every namespace unless -n)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return report(o, func(c *Cluster) (*PodsReport, error) { return c.Pods(cmd.Context(), o.namespaceOrAll(cmd)) })
		},
	}
}

func (o *options) topCommand() *cobra.Command {
	by, limit := byBytes, 10
	cmd := &cobra.Command{
		Use:   "top",
		Short: "The busiest pods (since their allocation; every namespace unless -n) and the peers with the most vconns",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return report(o, func(c *Cluster) (*TopReport, error) { return c.Top(cmd.Context(), o.namespaceOrAll(cmd), by, limit) })
		},
	}
	cmd.Flags().StringVar(&by, "by", by, "Order pods by bytes, messages (sent and received) or refusals.")
	cmd.Flags().IntVar(&limit, "limit", limit, "Rows of each table; 0: all.")
	return cmd
}

func (o *options) diagnoseCommand() *cobra.Command {
	var to string
	cmd := &cobra.Command{
		Use:   "diagnose POD [-n NAMESPACE] [--to ADDR]",
		Short: "Check what POD needs to use vconns (and reach ADDR: a pod's IP, IP:port, name or namespace/name); exits 1 if a check fails",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := o.cluster()
			if err != nil {
				return err
			}
			ns, _ := o.namespace(cmd)
			d, err := c.Diagnose(cmd.Context(), ns, args[0], to)
			if err != nil {
				return err
			}
			if err := write(o.out, o.format, d, d.table); err != nil {
				return err
			}
			if n := d.Failed(); n > 0 {
				return &ChecksFailed{Failed: n, Total: len(d.Checks)}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "The address the pod cannot reach: a pod's IP (with or without its port), or its name (namespace/name, or a name in -n).")
	return cmd
}
