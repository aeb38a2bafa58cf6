package controllers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// EventSource reports the operator's Events (their reportingController).
const EventSource = "rdmavisor.io/operator"

// Finalizer holds an RDMAService until the cluster-scoped objects rendered for
// it and the RDMANodes of its agents are deleted.
const Finalizer = "rdmavisor.io/cleanup"

// DefaultHeartbeatTimeout is how old an RDMANode heartbeat may be before the
// node counts as unhealthy.
const DefaultHeartbeatTimeout = 90 * time.Second

// RDMAServiceReconciler reconciles RDMAService objects.
type RDMAServiceReconciler struct {
	// Client writes with FieldOwner as field manager (see New).
	client.Client
	// Namespace receives the namespaced objects (DaemonSet, ConfigMap,
	// ServiceAccount) of every RDMAService.
	Namespace string
	// DefaultImage is the agent image of services that set none.
	DefaultImage string
	// HeartbeatTimeout: zero means DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Recorder, when set, records each change of a condition as an Event
	// on the service (kubectl describe rdmaservice, kubectl get events).
	Recorder events.EventRecorder
}

// New returns a reconciler whose writes are owned by FieldOwner.
func New(c client.Client, namespace, defaultImage string) *RDMAServiceReconciler {
	return &RDMAServiceReconciler{Client: client.WithFieldOwner(c, FieldOwner), Namespace: namespace, DefaultImage: defaultImage}
}

func (r *RDMAServiceReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (r *RDMAServiceReconciler) heartbeatTimeout() time.Duration {
	if r.HeartbeatTimeout > 0 {
		return r.HeartbeatTimeout
	}
	return DefaultHeartbeatTimeout
}

// The operator writes no ClusterRole and no admission policy: the chart
// installs the agents' ClusterRole and policies (static.go), and the
// operator holds bind on that one role only, so RBAC refuses any binding
// it makes to a role with more than it holds itself; the chart's
// OperatorBindingsPolicy then confines its bindings to the agents'
// service accounts. The signer's own rules are in signer.go.
//
// +kubebuilder:rbac:groups=rdmavisor.io,resources=rdmaservices,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=rdmavisor.io,resources=rdmaservices/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=rdmavisor.io,resources=rdmaservices/finalizers,verbs=update
// +kubebuilder:rbac:groups=rdmavisor.io,resources=rdmanodes,verbs=get;list;watch;delete;deletecollection
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterrolebindings,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=rbac.authorization.k8s.io,resources=clusterroles,resourceNames=rdmavisor-agent,verbs=bind
// +kubebuilder:rbac:groups=apps,namespace=rdmavisor-system,resources=daemonsets,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=rdmavisor-system,resources=configmaps;serviceaccounts,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=coordination.k8s.io,namespace=rdmavisor-system,resources=leases,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups="",namespace=rdmavisor-system,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Reconcile brings the objects of one RDMAService to what its spec asks and
// reports what the agents say in its status.
func (r *RDMAServiceReconciler) Reconcile(ctx context.Context, req ctrl.Request) (_ ctrl.Result, retErr error) {
	log := ctrl.LoggerFrom(ctx)

	svc := &v1alpha1.RDMAService{}
	if err := r.Get(ctx, req.NamespacedName, svc); err != nil {
		if apierrors.IsNotFound(err) {
			return ctrl.Result{}, nil
		}
		return ctrl.Result{}, fmt.Errorf("getting RDMAService %s: %w", req.Name, err)
	}
	if !svc.DeletionTimestamp.IsZero() {
		return ctrl.Result{}, r.reconcileDelete(ctx, svc)
	}
	if !controllerutil.ContainsFinalizer(svc, Finalizer) {
		log.V(1).Info("Adding the cleanup finalizer")
		orig := svc.DeepCopy()
		controllerutil.AddFinalizer(svc, Finalizer)
		if err := r.Patch(ctx, svc, client.MergeFrom(orig)); err != nil {
			return ctrl.Result{}, fmt.Errorf("adding finalizer: %w", err)
		}
	}

	before := svc.DeepCopy()
	defer func() {
		if retErr == nil {
			svc.Status.ObservedGeneration = svc.Generation
		} else if !errors.Is(retErr, context.Canceled) {
			r.setReconcileError(svc, retErr)
		}
		if err := r.patchStatus(ctx, before, svc); err != nil {
			retErr = errors.Join(retErr, err)
		}
	}()
	return r.reconcileNormal(ctx, svc)
}

// reconcileNormal runs the phases in order: placement, rendered objects,
// stale RDMANodes, status.
func (r *RDMAServiceReconciler) reconcileNormal(ctx context.Context, svc *v1alpha1.RDMAService) (ctrl.Result, error) {
	log := ctrl.LoggerFrom(ctx)
	if err := validateSpec(&svc.Spec); err != nil {
		return ctrl.Result{}, r.refuse(ctx, svc, err)
	}
	p, err := r.place(ctx, svc)
	if err != nil {
		return ctrl.Result{}, err
	}
	r.setConflict(svc, p)
	log.V(1).Info("Placed the agents", "selected", len(p.selected), "desired", len(p.desired),
		"excluded", len(p.excluded), "refused", p.refused)
	if err := r.applyObjects(ctx, svc, p); err != nil {
		return ctrl.Result{}, err
	}
	if err := r.pruneRDMANodes(ctx, svc, p); err != nil {
		return ctrl.Result{}, err
	}
	requeue, err := r.updateStatus(ctx, svc, p)
	return ctrl.Result{RequeueAfter: requeue}, err
}

// applyObjects server-side applies everything rendered for svc. Apply sends
// the whole intent each time; the API server writes only what changed.
func (r *RDMAServiceReconciler) applyObjects(ctx context.Context, svc *v1alpha1.RDMAService, p *placement) error {
	cfg, cfgData, err := renderConfig(svc)
	if err != nil {
		return reconcile.TerminalError(err)
	}
	// The agents mount the CA ConfigMap, which the signer would otherwise
	// publish only at the first certificate request: no agent could start
	// to make one.
	if _, err := EnsureCA(ctx, r.Client, r.Namespace); err != nil {
		return fmt.Errorf("publishing the agents' CA: %w", err)
	}
	image := svc.Spec.Agent.Image
	if image == "" {
		image = r.DefaultImage
	}
	if err := r.replaceOldBinding(ctx, svc); err != nil {
		return err
	}
	objs := []runtime.ApplyConfiguration{
		renderServiceAccount(svc, r.Namespace),
		renderClusterRoleBinding(svc, r.Namespace),
		renderConfigMap(svc, r.Namespace, cfgData),
	}
	if !p.refused {
		objs = append(objs, renderDaemonSet(svc, r.Namespace, image, cfg, cfgData, p.excluded, p.cdi))
	}
	for _, o := range objs {
		if err := r.Apply(ctx, o, client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %T: %w", o, err)
		}
	}
	if p.refused {
		return r.deleteIfPresent(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: objectName(svc), Namespace: r.Namespace}})
	}
	return nil
}

// refuse stops the agents of a service whose spec breaks a rule that keeps
// other tenants safe (validateSpec), and says why in its conditions. The
// schema refuses such specs; one stored before its rule existed (validation
// ratcheting keeps an unchanged field) must not keep its agents running: their
// device plugin would hold another vendor's resource, or their requests
// preempt tenant pods. A spec change reconciles the service again.
func (r *RDMAServiceReconciler) refuse(ctx context.Context, svc *v1alpha1.RDMAService, why error) error {
	ctrl.LoggerFrom(ctx).Info("Refusing to run agents for an invalid RDMAService", "reason", why.Error())
	if err := r.deleteIfPresent(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: objectName(svc), Namespace: r.Namespace}}); err != nil {
		return err
	}
	msg := "the operator runs no agents for this service: " + why.Error()
	r.setCondition(svc, metav1.Condition{Type: v1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonInvalidSpec, Message: msg})
	r.setCondition(svc, metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue, Reason: ReasonInvalidSpec, Message: msg})
	r.setCondition(svc, metav1.Condition{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: ReasonInvalidSpec})
	st := &svc.Status
	st.DesiredNodes, st.ReadyNodes, st.Nodes = 0, 0, "0/0"
	st.VConnCapacity, st.VConnsAllocated, st.VConnsInUse, st.QPsInUse = 0, 0, 0, 0
	return nil
}

// replaceOldBinding deletes the agents' ClusterRoleBinding if it binds
// another role than AgentClusterRole: operators before the chart shipped
// that role rendered one ClusterRole per service, and a binding's roleRef
// cannot change. Those ClusterRoles and policies, owned by their service,
// go with it (garbage collection); this operator may not delete them.
func (r *RDMAServiceReconciler) replaceOldBinding(ctx context.Context, svc *v1alpha1.RDMAService) error {
	b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: objectName(svc)}}
	if err := r.Get(ctx, client.ObjectKeyFromObject(b), b); err != nil {
		return client.IgnoreNotFound(err)
	}
	if b.RoleRef.Kind == "ClusterRole" && b.RoleRef.Name == AgentClusterRole {
		return nil
	}
	ctrl.LoggerFrom(ctx).Info("Replacing the agents' ClusterRoleBinding of an older operator", "binding", klog.KObj(b), "roleRef", b.RoleRef.Name)
	if err := r.Delete(ctx, b); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting ClusterRoleBinding %s: %w", b.Name, err)
	}
	return nil
}

// deleteIfPresent deletes obj if the cache has it, so that a reconcile with
// nothing to delete sends nothing.
func (r *RDMAServiceReconciler) deleteIfPresent(ctx context.Context, obj client.Object) error {
	if err := r.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
		return client.IgnoreNotFound(err)
	}
	ctrl.LoggerFrom(ctx).Info("Deleting", "kind", fmt.Sprintf("%T", obj), "object", klog.KObj(obj))
	if err := r.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
		return fmt.Errorf("deleting %s: %w", obj.GetName(), err)
	}
	return nil
}

// pruneRDMANodes deletes the RDMANodes of this service on nodes it no longer
// serves (node gone, unselected, or taken by an older service), so the next
// agent there can write its own.
func (r *RDMAServiceReconciler) pruneRDMANodes(ctx context.Context, svc *v1alpha1.RDMAService, p *placement) error {
	var list v1alpha1.RDMANodeList
	if err := r.List(ctx, &list, client.MatchingFields{indexServiceName: svc.Name}); err != nil {
		return fmt.Errorf("listing RDMANodes: %w", err)
	}
	served := p.served()
	var errs []error
	for i := range list.Items {
		if _, ok := slices.BinarySearch(served, list.Items[i].Name); !ok {
			errs = append(errs, r.deleteIfPresent(ctx, &list.Items[i]))
		}
	}
	return errors.Join(errs...)
}

// reconcileDelete removes what garbage collection would not (RDMANodes,
// written by the agents, have no owner) and what should go first: the
// DaemonSet, then the agents' permissions, so that no agent recreates an
// RDMANode after it is deleted. Owner references would eventually remove the
// rendered objects too; deleting them here makes cleanup prompt and complete
// even without a garbage collector.
func (r *RDMAServiceReconciler) reconcileDelete(ctx context.Context, svc *v1alpha1.RDMAService) error {
	if !controllerutil.ContainsFinalizer(svc, Finalizer) {
		return nil
	}
	log := ctrl.LoggerFrom(ctx)
	log.Info("Deleting the objects of the RDMAService")
	name, ns := objectName(svc), r.Namespace
	for _, obj := range []client.Object{
		&appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}},
	} {
		// Deleting without a cache lookup: a stale cache must not leave
		// an object behind once the finalizer is gone.
		if err := r.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground)); client.IgnoreNotFound(err) != nil {
			return fmt.Errorf("deleting %T %s: %w", obj, name, err)
		}
	}
	// The server filters on the CRD's selectable field, so RDMANodes the
	// cache has not seen yet are deleted too.
	if err := r.DeleteAllOf(ctx, &v1alpha1.RDMANode{}, client.MatchingFields{indexServiceName: svc.Name}); err != nil {
		return fmt.Errorf("deleting RDMANodes: %w", err)
	}
	orig := svc.DeepCopy()
	controllerutil.RemoveFinalizer(svc, Finalizer)
	if err := r.Patch(ctx, svc, client.MergeFrom(orig)); err != nil {
		return client.IgnoreNotFound(fmt.Errorf("removing finalizer: %w", err))
	}
	return nil
}

// SetupWithManager registers the reconciler and its watches.
func (r *RDMAServiceReconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &v1alpha1.RDMANode{}, indexServiceName, func(o client.Object) []string {
		return []string{o.(*v1alpha1.RDMANode).Spec.ServiceName}
	}); err != nil {
		return fmt.Errorf("indexing RDMANodes by service: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("rdmaservice").
		For(&v1alpha1.RDMAService{}).
		Owns(&appsv1.DaemonSet{}).
		Owns(&corev1.ConfigMap{}).
		Owns(&corev1.ServiceAccount{}).
		Owns(&rbacv1.ClusterRoleBinding{}).
		Watches(&v1alpha1.RDMANode{}, handler.EnqueueRequestsFromMapFunc(
			func(_ context.Context, o client.Object) []reconcile.Request {
				return []reconcile.Request{{NamespacedName: types.NamespacedName{Name: o.(*v1alpha1.RDMANode).Spec.ServiceName}}}
			})).
		// Placement depends on node labels and taints, and on the other
		// services' selectors and lifetimes.
		Watches(&corev1.Node{}, handler.EnqueueRequestsFromMapFunc(r.allServices),
			builder.WithPredicates(nodePlacementChanged())).
		Watches(&v1alpha1.RDMAService{}, handler.EnqueueRequestsFromMapFunc(r.allServices),
			builder.WithPredicates(servicePlacementChanged())).
		Complete(r)
}

// allServices enqueues every RDMAService but the one that changed.
func (r *RDMAServiceReconciler) allServices(ctx context.Context, changed client.Object) []reconcile.Request {
	var list v1alpha1.RDMAServiceList
	if err := r.List(ctx, &list); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Listing RDMAServices to re-place them")
		return nil
	}
	reqs := make([]reconcile.Request, 0, len(list.Items))
	for i := range list.Items {
		if _, isSvc := changed.(*v1alpha1.RDMAService); isSvc && list.Items[i].Name == changed.GetName() {
			continue
		}
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Name: list.Items[i].Name}})
	}
	return reqs
}

// nodePlacementChanged passes node events that can change placement or the
// rendered pods: not the status updates every kubelet sends.
func nodePlacementChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*corev1.Node), e.ObjectNew.(*corev1.Node)
			// The runtime decides whether the device plugin delivers by CDI.
			return !equality.Semantic.DeepEqual(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Spec.Taints, n.Spec.Taints) ||
				o.Status.NodeInfo.ContainerRuntimeVersion != n.Status.NodeInfo.ContainerRuntimeVersion
		},
	}
}

// servicePlacementChanged passes service events that can change another
// service's placement.
func servicePlacementChanged() predicate.Predicate {
	return predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, n := e.ObjectOld.(*v1alpha1.RDMAService), e.ObjectNew.(*v1alpha1.RDMAService)
			return !equality.Semantic.DeepEqual(o.Spec.NodeSelector, n.Spec.NodeSelector) ||
				o.DeletionTimestamp.IsZero() != n.DeletionTimestamp.IsZero()
		},
	}
}
