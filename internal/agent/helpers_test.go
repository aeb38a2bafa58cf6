package agent_test

import (
	"bytes"
	"net/http"
	"time"
)

func httpGet(url string) (int, error) {
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func bytesContains(b []byte, s string) bool { return bytes.Contains(b, []byte(s)) }
