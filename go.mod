module github.com/rdmavisor/rdmavisor

go 1.26.0

require (
	github.com/go-logr/logr v1.4.4 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/net v0.62.0 // indirect
	golang.org/x/sys v0.50.0 // indirect
)
