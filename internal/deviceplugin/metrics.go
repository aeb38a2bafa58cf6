package deviceplugin

import "github.com/prometheus/client_golang/prometheus"

// metrics are the plugin's Prometheus metrics.
type metrics struct {
	advertised    prometheus.Gauge
	healthy       prometheus.Gauge
	allocated     prometheus.Gauge
	allocations   *prometheus.CounterVec // by result
	registrations *prometheus.CounterVec // by result
	collected     prometheus.Counter
	recreated     prometheus.Counter
}

func newMetrics(r prometheus.Registerer) (*metrics, error) {
	const ns, sub = "rdmavisor", "device_plugin"
	m := &metrics{
		advertised: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "devices_advertised",
			Help: "Devices (vconns) advertised to the kubelet."}),
		healthy: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "devices_healthy",
			Help: "Devices advertised as Healthy."}),
		allocated: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "devices_allocated",
			Help: "Devices (vconns of quota) held by the device plugin's allocations in the agent."}),
		allocations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "allocate_requests_total",
			Help: "Container allocations requested by the kubelet, by result."}, []string{"result"}),
		registrations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "registrations_total",
			Help: "Registrations with the kubelet, by result."}, []string{"result"}),
		collected: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "allocations_collected_total",
			Help: "Allocations deleted because no pod holds their devices any more."}),
		recreated: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "allocations_recreated_total",
			Help: "Allocations of running pods created again after the agent lost them."}),
	}
	for _, c := range []prometheus.Collector{m.advertised, m.healthy, m.allocated, m.allocations, m.registrations, m.collected, m.recreated} {
		if err := r.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
