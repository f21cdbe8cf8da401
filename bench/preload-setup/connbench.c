/* Connection setup through the preload library, as a program sees it:
 * connect, a 1-byte request, a 1-byte reply, close, one connection at a
 * time to a server that accepts, answers and closes.
 *
 *   connbench s PORT [IP]       serve on IP:PORT (default 127.0.0.1) until
 *                               killed
 *   connbench c PORT [N [IP]]   N connections (default 1000) to IP:PORT;
 *                               prints the mean, median and 90th
 *                               percentile per connection, in microseconds
 *
 * bench/run-preload-setup.sh runs it over the kernel's TCP and under the
 * library, side by side, on one host; bench/run-preload-xdp.sh across two
 * testbed hosts. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){int port=atoi(argv[2]); int n=argc>3?atoi(argv[3]):1000; struct sockaddr_in a={0}; a.sin_family=AF_INET; a.sin_port=htons(port); a.sin_addr.s_addr=htonl(0x7f000001);
 const char *ip=argv[1][0]=='s'?(argc>3?argv[3]:0):(argc>4?argv[4]:0);
 if(ip&&inet_pton(AF_INET,ip,&a.sin_addr)!=1){fprintf(stderr,"bad address %s\n",ip); return 2;}
 char b[64];
 if(argv[1][0]=='s'){int l=socket(AF_INET,SOCK_STREAM,0); int one=1; setsockopt(l,SOL_SOCKET,SO_REUSEADDR,&one,4); bind(l,(void*)&a,sizeof a); listen(l,128);
   for(;;){int c=accept(l,0,0); if(c<0)continue; ssize_t k=read(c,b,1); if(k==1) write(c,b,1); read(c,b,1); close(c);} }
 double t0=now(); double *lat=malloc(n*sizeof(double));
 for(int i=0;i<n;i++){double s=now(); int c=socket(AF_INET,SOCK_STREAM,0); connect(c,(void*)&a,sizeof a); write(c,"x",1); if(read(c,b,1)!=1){fprintf(stderr,"short\n");} close(c); lat[i]=now()-s;}
 double tot=now()-t0;
 int cmp(const void*x,const void*y){double d=*(double*)x-*(double*)y; return d<0?-1:d>0;}
 qsort(lat,n,sizeof(double),cmp);
 printf("%d connections: %.1f us each (mean), median %.1f us, p90 %.1f us\n",n,tot/n*1e6,lat[n/2]*1e6,lat[n*9/10]*1e6); return 0;}
