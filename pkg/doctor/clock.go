package doctor

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ServerClock tells the API server's current time.
type ServerClock interface {
	ServerTime(ctx context.Context) (time.Time, error)
}

// HTTPServerClock reads the Date header of a GET of URL (the API server's
// /version, which every authenticated client may read) made with Client,
// which carries the API server's TLS settings and credentials
// (rest.HTTPClientFor).
type HTTPServerClock struct {
	Client *http.Client
	URL    string
}

// ServerTime returns the response's Date. Any status will do: the header
// is what is read.
func (h HTTPServerClock) ServerTime(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, h.URL, nil)
	if err != nil {
		return time.Time{}, err
	}
	client := h.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		return time.Time{}, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	date := resp.Header.Get("Date")
	if date == "" {
		return time.Time{}, fmt.Errorf("GET %s: %s without a Date header", h.URL, resp.Status)
	}
	t, err := http.ParseTime(date)
	if err != nil {
		return time.Time{}, fmt.Errorf("GET %s: Date header %q: %w", h.URL, date, err)
	}
	return t, nil
}
