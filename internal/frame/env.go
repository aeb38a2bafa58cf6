package frame

// Environment variables the device plugin sets in a pod's container, and
// where pkg/vconn looks for the allocation it was given. They live with the
// protocol so that the device plugin names them without linking the SDK.
const (
	// EnvSocket is the allocation's socket path inside the container.
	EnvSocket = "RDMAVISOR_SOCKET"
	// EnvVConns is the number of vconns the allocation holds.
	EnvVConns = "RDMAVISOR_VCONNS"
)
